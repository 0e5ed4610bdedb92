"""The Python API: ``sim.run`` and ``sim.compare``, the command line's twins.

Both take the fields of the settings schema (``sim.inputs.schema``: the command line's
flags with underscores, ``tensor_model_parallel_size=2``, ``global_batch_size=64``,
``schedule="1f1b"``, ``gpu="h100-sxm"``, ``nodes=2``, ...), an experiment file, or both
(keywords override the file, as flags after a file do). Each value is checked as the
field checks it and the run goes through ``sim.session``, as ``trainsim run`` does, so
the API, the CLI and experiment files cannot disagree: ``sim.run(...).to_json()`` is
what ``trainsim run ... --json`` prints.

    >>> import sim
    >>> tiny = {"num_layers": 4, "hidden_size": 512, "num_attention_heads": 8,
    ...         "vocab_size": 8192, "seq_length": 512}
    >>> r = sim.run(model=tiny, gpu="h100-sxm", gpus=8, tensor_model_parallel_size=2,
    ...             global_batch_size=8)
    >>> r.plan.dp, r.plan.tp, r.fits
    (4, 2, True)
    >>> r.iteration_time_s == r.to_dict()["iteration_time_s"] > 0
    True

A ``RunResult`` keeps the whole simulated run: ``.trace`` (every span, for your own
analysis), ``.summary`` (the JSON summary), ``.save(dir)`` (the files ``--out``
writes). ``sim.compare`` runs several plans and returns a ``Comparison``: one
``RunResult`` per plan, the table rows, and the best plan.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from sim import session
from sim.errors import InputError
from sim.inputs.experiment import (MODEL_FIELDS, Experiment, Setting, blame, named_in, read_experiment,
                                   settings_from_values, values_of)
from sim.inputs.schema import RunSettings
from sim.studies.compare import Comparison, plan_dirs  # noqa: F401  (re-exported)

from sim.inputs.variants import Variant, fit_vpp_to_schedule, plan_settings, variants_of

__all__ = ["RunResult", "Comparison", "run", "compare"]


# ---------------------------------------------------------------- results
@dataclass
class RunResult:
    """One simulated training iteration: its JSON summary and the run behind it.

    The headline figures are attributes (``iteration_time_s``, ``tokens_per_s``, ``mfu``,
    ``bubble_fraction``, ``peak_memory_bytes``, ``fits``); ``summary`` holds them all,
    exactly as ``trainsim run --json`` prints them.
    """

    summary: dict
    run: object = field(repr=False)
    """The ``sim.session.TrainingRun``: model, plan, profile, topology, schedule, program, trace."""
    name: str = ""
    description: str = ""

    @property
    def trace(self):
        """The ``sim.results.trace.Trace``: every span of every simulated GPU, transfers, memory."""
        return self.run.trace

    @property
    def model(self):
        return self.run.model

    @property
    def plan(self):
        return self.run.plan

    @property
    def iteration_time_s(self) -> float:
        return self.summary["iteration_time_s"]

    @property
    def tokens_per_s(self) -> float:
        return self.summary["tokens_per_s"]

    @property
    def mfu(self) -> float:
        return self.summary["mfu"]

    @property
    def bubble_fraction(self) -> float:
        return self.summary["bubble_fraction"]

    @property
    def peak_memory_bytes(self) -> float:
        return self.summary["memory"]["peak_bytes"]

    @property
    def fits(self) -> bool:
        return self.summary["fits"]

    def to_dict(self) -> dict:
        """The summary as plain JSON-ready data (a copy)."""
        return json.loads(self.to_json())

    def to_json(self) -> str:
        """The summary as one JSON object, byte for byte what ``trainsim run --json`` prints."""
        return json.dumps(self.summary, sort_keys=True)

    def save(self, out: str | Path, *, kineto: bool = False, chakra: bool = False) -> Path:
        """Write summary.json, trace.json (Perfetto), timeline.png and memory.png into
        ``out`` (and ``kineto/trace_rank{r}.json`` with ``kineto=True``; Chakra execution
        traces, ``chakra/trainsim.{r}.et`` and ``chakra/comm_group.json``, with
        ``chakra=True``); returns ``out``."""
        out = Path(out)
        if chakra:  # (first: it refuses a reduced-fidelity run before anything is written)
            session.write_chakra_files(self.run, out / "chakra")
        if kineto:
            session.write_kineto_files(self.run, out / "kineto")
        session.write_outputs(self.run, self.summary, out)
        return out

    def __repr__(self) -> str:
        s = self.summary
        return (f"RunResult({self.name + ': ' if self.name else ''}{s['model']} on {s['gpus']} x {s['gpu']}, "
                f"iteration {s['iteration_time_s'] * 1e3:.3f} ms, {s['tokens_per_s']:,.0f} tokens/s, "
                f"MFU {s['mfu'] * 100:.1f}%, peak {s['memory']['peak_bytes'] / 2**30:.2f} GiB "
                f"({'fits' if s['fits'] else 'OOM'}))")


# ---------------------------------------------------------------- running
def _model_settings(model) -> tuple[dict[str, Setting], object]:
    """Settings for ``model=`` (a preset name, a config.json path or a dict of [model]
    keys), or a ``ModelSpec`` to use as it is."""
    from sim.inputs.model import ModelSpec

    if model is None:
        return {}, None
    if isinstance(model, ModelSpec):
        return {}, model
    if isinstance(model, (str, Path)):
        key = "hf_config" if str(model).endswith(".json") else "model"
        return settings_from_values({key: str(model)}, "model."), None
    if isinstance(model, dict):
        values = {("model" if k == "preset" else k): v for k, v in model.items()}
        return settings_from_values(values, "model."), None
    raise InputError(f"model: got {model!r}; expected a preset name, a config.json path, a dict of "
                     "[model] keys (num_layers=..., ...) or a sim.inputs.model.ModelSpec")


def _base(experiment, model, settings: dict) -> tuple[Experiment | None, dict[str, Setting], object]:
    """The experiment file (if any) and the settings that every plan shares."""
    exp = read_experiment(experiment) if experiment is not None else None
    base = dict(exp.settings) if exp else {}
    model_set, model_obj = _model_settings(model)
    if model is not None:  # model= replaces the file's [model] as a whole
        base = {d: s for d, s in base.items() if d not in MODEL_FIELDS}
    base.update(model_set)
    base.update(settings_from_values(settings))
    return exp, base, model_obj


def check_model_given(exp: Experiment | None, settings: dict, model_obj=None, hint: str = "--model") -> None:
    """Raise unless the settings (or ``model_obj``) name a model."""
    if model_obj is None and not any(d in MODEL_FIELDS and d != "seq_length" for d in settings):
        where = f"{exp.path}: " if exp else ""
        raise InputError(f"{where}model: missing; add a [model] table (preset = \"llama2-7b\", "
                         f"hf_config = \"config.json\" or num_layers = ..., hidden_size = ...) or pass {hint}")


def _simulate(settings: dict[str, Setting], model_obj=None, plan_obj=None, name: str = "",
              description: str = "") -> RunResult:
    prepared = session.prepare(RunSettings.from_values(values_of(settings)), model_obj, plan_obj)
    training_run, summary = session.run(prepared)
    return RunResult(summary, training_run, name, description)


def run(experiment: str | Path | None = None, *, model=None, plan=None, progress: bool | None = False,
        **settings) -> RunResult:
    """Simulate one training iteration and return its ``RunResult``.

    ``experiment``: an experiment TOML file (optional). ``model``: a preset name
    (``"llama2-7b"``), a Hugging Face ``config.json`` path, a dict of [model] keys, or a
    ``sim.inputs.model.ModelSpec``. ``plan``: a dict of [plan] keys, a ``sim.inputs.plan.ParallelPlan``,
    or the name of one of the file's ``[[plans]]``. Any other keyword is a ``trainsim
    run`` flag with underscores (``gpu``, ``gpus``, ``nodes``, ``topology``, ``fabric``,
    ``fidelity``, ``tensor_model_parallel_size``, ``schedule``, ``zero``, ...) and
    overrides the file. ``progress=None`` shows progress on a terminal's stderr.
    Bad input raises ``sim.errors.InputError`` with the one-line message the CLI prints.

    >>> import sim
    >>> r = sim.run(model={"num_layers": 4, "hidden_size": 512, "num_attention_heads": 8,
    ...                    "vocab_size": 8192, "seq_length": 512},
    ...             gpu="h100-sxm", gpus=8, pipeline_model_parallel_size=2,
    ...             global_batch_size=16, schedule="gpipe")
    >>> r.summary["schedule"], r.plan.pp, r.plan.num_microbatches
    ('gpipe', 2, 4)
    >>> 0 < r.bubble_fraction < 0.5 and r.fits
    True
    >>> sorted(r.summary["exposed_comm_s"])
    ['dp', 'pp', 'tp', 'zero']
    >>> sim.run(model="llama2-7b", tensor_model_parallel_size=3)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    sim.errors.InputError: tensor_model_parallel_size: got 3; must divide num_attention_heads 32 of llama2-7b...
    """
    from sim.progress import Progress

    exp, base, model_obj = _base(experiment, model, settings)
    plan_set, plan_obj = plan_settings(plan)
    if isinstance(plan, str):
        if exp is None:
            raise InputError(f"plan: got {plan!r}; a plan name needs an experiment file with [[plans]]")
        entry = exp.plan(plan)
        base = {**base, **entry.settings, **settings_from_values(settings)}
    elif exp is not None and exp.plans:
        raise InputError(f"{exp.path}: plans: the file lists {len(exp.plans)} plans "
                         f"({', '.join(p.name for p in exp.plans)}); pass plan=NAME, or use sim.compare")
    base.update(plan_set)
    check_model_given(exp, base, model_obj)
    with Progress(enabled=progress) as bar:
        bar.update("simulating")
        try:
            return _simulate(base, model_obj=model_obj, plan_obj=plan_obj, name=plan if isinstance(plan, str) else "")
        except InputError as exc:
            raise (named_in(exc, base) if exp is None else blame(exc, exp.path, base)) from None


def compare(experiment: str | Path | None = None, plans: list | None = None, *, model=None,
            schedules: list[str] | None = None, zero_stages: list[int] | None = None,
            progress: bool | None = False, rank_by: str = "throughput", **settings) -> Comparison:
    """Simulate several plans on one model and cluster; returns a ``Comparison``.

    The plans are the experiment file's ``[[plans]]``, or ``plans`` (dicts of [plan] keys
    with a ``"name"``, or ``ParallelPlan``s), each also run under every value of
    ``schedules`` and ``zero_stages`` when given (alone, those vary one base plan).
    Other keywords are as for ``run`` and apply to every plan. ``rank_by``: what picks the
    best plan, ``"throughput"`` (tokens/s) or ``"tokens-per-joule"``.

    >>> import sim
    >>> c = sim.compare(model={"num_layers": 4, "hidden_size": 512, "num_attention_heads": 8,
    ...                        "vocab_size": 8192, "seq_length": 512},
    ...                 gpu="h100-sxm", gpus=8, pipeline_model_parallel_size=4,
    ...                 global_batch_size=16, schedules=["gpipe", "1f1b"])
    >>> [r.name for r in c]
    ['gpipe', '1f1b']
    >>> c["gpipe"].iteration_time_s > 0 and c.best is not None
    True
    >>> c["gpipe"].peak_memory_bytes > c["1f1b"].peak_memory_bytes   # GPipe stashes every micro-batch
    True
    >>> sorted(c.rows[0])[:4]
    ['best', 'bubble_fraction', 'bubble_s', 'capacity_bytes']
    """
    from sim.progress import Progress

    exp, base, model_obj = _base(experiment, model, settings)
    variants = variants_of(exp, plans, schedules, zero_stages)
    keywords = settings_from_values(settings)
    # Keywords override the file's plans; plans given here override the keywords.
    merged = [({**base, **v.settings, **keywords, **v.axis} if v.from_file else {**base, **v.settings, **v.axis})
              for v in variants]
    merged = [fit_vpp_to_schedule(v, m, _layers_of(m, model_obj)) for v, m in zip(variants, merged)]
    if variants:
        check_model_given(exp, merged[0], model_obj)
    for v, m in zip(variants, merged):  # every plan's input errors before anything is simulated
        check_variant(exp, v, m, model_obj)
    results = []
    with Progress(total=len(variants), enabled=progress) as bar:
        for i, (v, m) in enumerate(zip(variants, merged)):
            gpus = f"{results[0].summary['gpus']} GPUs, " if results else ""
            bar.update(f"simulating {gpus}plan {i + 1}/{len(variants)} ({v.name})", done=i)
            results.append(simulate_variant(exp, v, m, model_obj))
    return Comparison(results, rank_by=rank_by)


def _layers_of(settings: dict[str, Setting], model_obj=None):
    """The model's transformer layers, for ``fit_vpp_to_schedule`` (resolved only when asked)."""
    def layers() -> int:
        if model_obj is not None:
            return model_obj.num_layers
        from sim.inputs.resolve import model_from_settings

        return model_from_settings(RunSettings.from_values(values_of(settings)).model).num_layers
    return layers


def simulate_variant(exp, v: Variant, settings: dict[str, Setting], model_obj=None) -> RunResult:
    """Simulate one plan of a comparison; an input error names the plan (and its line)."""
    try:
        return _simulate(settings, model_obj, v.plan, v.name, v.description)
    except InputError as exc:
        raise _in_plan(exc, exp, v) from None


def check_variant(exp, v: Variant, settings: dict[str, Setting], model_obj=None) -> None:
    """Check one plan of a comparison without simulating it (errors as ``simulate_variant``'s),
    so that a bad third plan is reported before the first is simulated."""
    try:
        session.prepare(RunSettings.from_values(values_of(settings)), model_obj, v.plan)
    except InputError as exc:
        raise _in_plan(exc, exp, v) from None


def _in_plan(exc: InputError, exp, v: Variant) -> InputError:
    loc = f"{exp.path}:{v.line}: " if exp is not None and v.line else ""
    return InputError(f"{loc}plan {v.name!r}: {exc}")
