# Two commands do all set-up from a fresh clone:
#   make run   - create .venv, install trainsim, run the demo and write its plots to out/demo/
#   make test  - create .venv, install trainsim with test extras, check the wheel (build it,
#                install it into a fresh venv, run trainsim from it), run the whole suite
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

# The test extra holds everything the suite needs, so `pip install -e '.[test]'` gives this
# environment: pytest, dask, hypothesis, torch and Holistic Trace Analysis (see pyproject.toml).
$(VENV)/.installed-test: pyproject.toml Makefile | $(BIN)/python
	$(BIN)/pip install -q -e '.[test]' $(TORCH_PIN)
	touch $@

run: $(VENV)/.installed
	$(BIN)/trainsim demo --out out/demo

# One pytest worker per core (pytest-xdist), each taking whole test files, so a file's
# module-scoped fixtures (the experiments' quick runs, the fit's truth profile) run once.
# The wheel check runs first. Then sim/ and experiments/ are byte-compiled: the suite starts
# many interpreters (commands, spawned sweep/search/fit workers, the docs' examples), and where
# PYTHONDONTWRITEBYTECODE is set (as on the shared machine) none writes a .pyc, so each one
# compiled trainsim again (about 0.25 s of CPU an interpreter; issue 55).
test: wheel-check $(VENV)/.installed-test
	$(BIN)/python -m compileall -q sim experiments
	$(BIN)/python -m pytest -n auto --dist loadfile

# The wheel as a user gets it: built from this tree, installed with its dependencies into a
# fresh virtual environment, then every module of the installed package imported and a short
# simulation run, away from the source tree (a module or data file the wheel lacks fails
# here; tests/test_packaging.py compares the wheel's files with the tree's). The fresh
# environment has no pip of its own (--without-pip): the project environment's pip installs
# into it (--python), from the same indexes, so the dependencies the test extra just fetched
# come from pip's cache; --no-compile skips byte-compiling SciPy and Matplotlib (about 15 s).
WHEEL_DIR := out/wheel
WHEEL_VENV := out/wheel-venv
WHEEL_SMOKE := run --model llama2-7b --gpu h100-sxm --topology dgx-h100 --gpus 8 --tensor-model-parallel-size 2 \
	--pipeline-model-parallel-size 2 --global-batch-size 8
.PHONY: wheel-check
wheel-check: $(VENV)/.installed-test
	rm -rf build $(WHEEL_DIR) $(WHEEL_VENV)
	$(BIN)/pip wheel -q --no-deps -w $(WHEEL_DIR) .
	$(PYTHON) -m venv --without-pip $(WHEEL_VENV)
	$(BIN)/pip --python $(WHEEL_VENV)/bin/python install -q --no-compile $(WHEEL_DIR)/trainsim-*.whl
	cd $(WHEEL_DIR) && env -u PYTHONPATH ../wheel-venv/bin/python -c "$$WHEEL_IMPORTS"
	cd $(WHEEL_DIR) && env -u PYTHONPATH ../wheel-venv/bin/trainsim $(WHEEL_SMOKE) > smoke.txt
	@echo "wheel-check: $$(ls $(WHEEL_DIR)/*.whl) installs, imports and runs ($(WHEEL_DIR)/smoke.txt)"

define WHEEL_IMPORTS
import importlib, pkgutil, sim
assert "wheel-venv" in sim.__file__, sim.__file__
names = [m.name for m in pkgutil.walk_packages(sim.__path__, "sim.") if m.name != "sim.__main__"]
for name in names:
    importlib.import_module(name)
print(f"wheel-check: imported {len(names)} modules from {sim.__file__}")
endef
export WHEEL_IMPORTS

# The property tests with hypothesis' "fuzz" profile (tests/_hypothesis_profiles.py): random
# seeds, 500-2000 examples per test instead of the CI profile's few dozen; a few minutes.
.PHONY: fuzz
fuzz: $(VENV)/.installed-test
	HYPOTHESIS_PROFILE=fuzz $(BIN)/python -m pytest tests/test_properties.py --hypothesis-show-statistics

clean:
	rm -rf $(VENV) out experiments/out build

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
	$(BIN)/python experiments/moe_layout.py
	$(BIN)/python experiments/strong_scaling.py
	$(BIN)/python experiments/nvl72.py
	$(BIN)/python experiments/attention_kinds.py
	$(BIN)/python experiments/report.py
