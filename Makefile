# Two commands do all set-up from a fresh clone:
#   make run   - create .venv, install trainsim, run the demo and write its plots to out/demo/
#   make test  - create .venv, install trainsim with test extras, run the whole suite
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# The CPU build of torch that installs from local disk; a bare "torch" pulls a multi-GB CUDA build.
TORCH_PIN := torch==2.13.0

.PHONY: run test clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q -e .
	touch $@

# Holistic Trace Analysis: tests/test_kineto.py loads the Kineto-shaped traces with it. Its
# package declares JupyterLab (hundreds of MB) that the analysis never imports, so it goes
# in without its declared requirements, followed by the ones it does import.
HTA := HolisticTraceAnalysis==0.5.0
HTA_DEPS := pandas plotly pydot psutil pyyaml

$(VENV)/.installed-test: pyproject.toml Makefile | $(BIN)/python
	$(BIN)/pip install -q -e '.[test]' $(TORCH_PIN)
	$(BIN)/pip install -q --no-deps $(HTA)
	$(BIN)/pip install -q $(HTA_DEPS)
	touch $@

run: $(VENV)/.installed
	$(BIN)/trainsim demo --out out/demo

# One pytest worker per core (pytest-xdist), each taking whole test files, so a file's
# module-scoped fixtures (the experiments' quick runs, the fit's truth profile) run once.
test: $(VENV)/.installed-test
	$(BIN)/python -m pytest -n auto --dist loadfile

# The property tests with hypothesis' "fuzz" profile (tests/_hypothesis_profiles.py): random
# seeds, 500-2000 examples per test instead of the CI profile's few dozen; a few minutes.
.PHONY: fuzz
fuzz: $(VENV)/.installed-test
	HYPOTHESIS_PROFILE=fuzz $(BIN)/python -m pytest tests/test_properties.py --hypothesis-show-statistics

clean:
	rm -rf $(VENV) out experiments/out

# The experiments of issue 8: one script per question, then experiments/out/REPORT.md.
.PHONY: experiments
experiments: $(VENV)/.installed
	$(BIN)/python experiments/pipeline_bubble.py
	$(BIN)/python experiments/allreduce_scaling.py
	$(BIN)/python experiments/tensor_parallel.py
	$(BIN)/python experiments/zero_stages.py
	$(BIN)/python experiments/gpt3_3d.py
	$(BIN)/python experiments/grad_accumulation.py
	$(BIN)/python experiments/megatron_table2.py
	$(BIN)/python experiments/stage_imbalance.py
	$(BIN)/python experiments/nccl_algorithms.py
	$(BIN)/python experiments/goodput_scale.py
	$(BIN)/python experiments/moe_imbalance.py
	$(BIN)/python experiments/context_parallel.py
	$(BIN)/python experiments/report.py
