"""The Python API: ``sim.run`` and ``sim.compare``, the command line's twins.

Both take what the command line takes, under the flags' names with underscores
(``tensor_model_parallel_size=2``, ``global_batch_size=64``, ``schedule="1f1b"``,
``gpu="h100-sxm"``, ``nodes=2``, ...), an experiment file, or both (keywords override
the file, as flags after a file do). The values go through the very parser ``trainsim
run`` uses, so the API, the CLI and experiment files cannot disagree: ``sim.run(...)
.to_json()`` is what ``trainsim run ... --json`` prints.

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
import re
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

from sim.errors import InputError
from sim.inputs.experiment import Experiment, Setting, read_experiment, settings_argv, settings_from_values

from sim.inputs.variants import Variant, plan_settings as _plan_settings, variants_of  # noqa: F401  (re-exported)

__all__ = ["RunResult", "Comparison", "run", "compare"]


@lru_cache(maxsize=1)
def _parser():
    """The parser of ``trainsim run`` (errors are ``InputError``s, as on the command line)."""
    from sim.cli import _Parser
    from sim.commands import run as run_cmd

    p = _Parser(prog="trainsim run")
    run_cmd.add_arguments(p)
    return p


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
    """The ``sim.build.training.TrainingRun``: model, plan, profile, topology, schedule, program, trace."""
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

    def save(self, out: str | Path, *, kineto: bool = False) -> Path:
        """Write summary.json, trace.json (Perfetto), timeline.png and memory.png into
        ``out`` (and ``kineto/trace_rank{r}.json`` with ``kineto=True``); returns ``out``."""
        from sim.commands.run import write_outputs

        out = Path(out)
        if kineto:
            write_kineto_files(self.run, out / "kineto")
        write_outputs(self.run, self.summary, out)
        return out

    def __repr__(self) -> str:
        s = self.summary
        return (f"RunResult({self.name + ': ' if self.name else ''}{s['model']} on {s['gpus']} x {s['gpu']}, "
                f"iteration {s['iteration_time_s'] * 1e3:.3f} ms, {s['tokens_per_s']:,.0f} tokens/s, "
                f"MFU {s['mfu'] * 100:.1f}%, peak {s['memory']['peak_bytes'] / 2**30:.2f} GiB "
                f"({'fits' if s['fits'] else 'OOM'}))")


def write_kineto_files(training_run, out: str | Path) -> list[Path]:
    """The Kineto-shaped traces of a run, one ``trace_rank{r}.json`` per simulated GPU."""
    from sim.commands.run import _names
    from sim.results.export_kineto import collective_groups, write_kineto

    return write_kineto(training_run.trace, out, world_size=training_run.plan.world_size,
                        device_name=training_run.profile.name,
                        memory_bytes=training_run.profile.hbm_capacity_bytes,
                        groups=collective_groups(training_run.program), names=_names(training_run))


@dataclass
class Comparison:
    """Several plans simulated on the same model and cluster.

    Iterating gives the ``RunResult``s in order; ``rows`` the table ``trainsim compare``
    prints, as dicts; ``best`` the plan with the most tokens/s among those that fit.
    """

    results: list[RunResult]
    title: str = ""
    """The chart's title (default: the model, the GPUs and the number of plans)."""

    def __post_init__(self):
        if not self.title:
            self.title = _title(self.results)

    def __iter__(self):
        return iter(self.results)

    def __len__(self) -> int:
        return len(self.results)

    def __getitem__(self, key: int | str) -> RunResult:
        if isinstance(key, str):
            for r in self.results:
                if r.name == key:
                    return r
            raise KeyError(key)
        return self.results[key]

    @property
    def best(self) -> RunResult | None:
        """The fitting plan with the most tokens/s (ties: the first listed); None if none fits."""
        fitting = [r for r in self.results if r.fits]
        return max(fitting, key=lambda r: r.tokens_per_s) if fitting else None

    @property
    def rows(self) -> list[dict]:
        """One dict per plan: the figures of the table and of the chart (SI units)."""
        best = self.best
        return [_row(r, r is best) for r in self.results]

    def to_dict(self) -> dict:
        best = self.best
        return {"title": self.title, "best": best.name if best else None, "rows": self.rows,
                "plans": [{"name": r.name, "description": r.description, "summary": r.summary}
                          for r in self.results]}

    def to_json(self) -> str:
        """``trainsim compare --json``'s output: the rows, the best plan's name and every summary."""
        return json.dumps(self.to_dict(), sort_keys=True)

    def save(self, out: str | Path, *, kineto: bool = False) -> Path:
        """Write each plan's outputs into ``out/<plan>/``, plus ``compare.png`` (iteration
        time split into compute, exposed communication and bubble, and peak memory) and
        ``compare.json``; returns ``out``."""
        from sim.results.export import write_json_atomic
        from sim.results.plot import plot_compare

        out = Path(out)
        for r, d in zip(self.results, plan_dirs([r.name for r in self.results])):
            r.save(out / d, kineto=kineto)
        plot_compare(self.rows, out / "compare.png", title=self.title)
        write_json_atomic(self.to_dict(), out / "compare.json")
        return out

    def __repr__(self) -> str:
        best = self.best
        return f"Comparison({len(self.results)} plans, best: {best.name if best else 'none fits'})"


def plan_dirs(names: list[str]) -> list[str]:
    """A folder name per plan: lower case, runs of other characters as '-', unique."""
    out: list[str] = []
    for n in names:
        base = re.sub(r"[^a-z0-9._]+", "-", n.lower()).strip("-.") or "plan"
        d, k = base, 2
        while d in out:
            d, k = f"{base}-{k}", k + 1
        out.append(d)
    return out


def _row(r: RunResult, best: bool) -> dict:
    s = r.summary
    T = s["iteration_time_s"]
    bubble = s["bubble_fraction"] * T
    m = s["memory"]
    parts = {"parameters": m["parameters_bytes"], "gradients": m["gradients_bytes"],
             "optimizer": m["optimizer_bytes"], "activations": m["activations_bytes"]}
    parts["other"] = max(0.0, m["peak_bytes"] - sum(parts.values()))
    return {"name": r.name, "description": r.description, "best": best, "iteration_time_s": T,
            "tokens_per_s": s["tokens_per_s"], "mfu": s["mfu"], "bubble_fraction": s["bubble_fraction"],
            "compute_s": s["compute_s"], "exposed_comm_s": dict(s["exposed_comm_s"]), "bubble_s": bubble,
            "other_idle_s": max(0.0, s["idle_s"] - bubble), "idle_s": s["idle_s"],
            "peak_bytes": m["peak_bytes"], "memory_bytes": parts,
            "capacity_bytes": s["memory_capacity_bytes"], "fits": s["fits"], "gpus": s["gpus"],
            "schedule": s["schedule"], "zero_stage": s["plan"]["zero_stage"]}


# ---------------------------------------------------------------- running
def simulate_namespace(ns, model=None, plan=None):
    """Simulate what parsed ``trainsim run`` flags describe; returns ``(TrainingRun, summary)``.
    ``model`` (a ``ModelSpec``) and ``plan`` (a ``ParallelPlan``) replace what the flags say."""
    from sim.commands import run as run_cmd
    from sim.build.training import simulate_training

    model, plan, profile, topo, schedule = prepare_namespace(ns, model, plan)
    training_run = simulate_training(model, plan, profile, topo, schedule, ns.fidelity,
                                     max_events=run_cmd.max_events_of(ns))
    return training_run, run_cmd.summarize(training_run)


def prepare_namespace(ns, model=None, plan=None):
    """Everything ``simulate_namespace`` checks and builds before simulating: ``(model,
    plan, profile, topology, schedule)``; every input error is raised here."""
    from sim.commands import run as run_cmd
    from sim.commands._spec import model_from_args, plan_from_args, schedule_from_args
    from sim.inputs.hardware import load_profile

    model = model if model is not None else model_from_args(ns)
    profile = load_profile(ns.gpu, flag="--gpu")
    ns.gpus = run_cmd._gpus(ns)
    if plan is None:
        plan = plan_from_args(ns, model)
    elif plan.schedule == "custom":
        raise InputError("plan: a ParallelPlan with schedule 'custom' needs its CSV: "
                         "pass schedule='path/to.csv' instead of a ParallelPlan")
    else:
        plan.check_model(model)
    schedule = schedule_from_args(ns, plan)
    topo = run_cmd._cluster(ns, plan.world_size, profile.name)
    return model, plan, profile, topo, schedule


def _model_settings(model, parser) -> tuple[dict[str, Setting], object]:
    """Settings for ``model=`` (a preset name, a config.json path or a dict of [model]
    keys), or a ``ModelSpec`` to use as it is."""
    from sim.inputs.model import ModelSpec

    if model is None:
        return {}, None
    if isinstance(model, ModelSpec):
        return {}, model
    if isinstance(model, (str, Path)):
        key = "hf_config" if str(model).endswith(".json") else "model"
        return settings_from_values({key: str(model)}, parser, "model."), None
    if isinstance(model, dict):
        values = {("model" if k == "preset" else k): v for k, v in model.items()}
        return settings_from_values(values, parser, "model."), None
    raise InputError(f"model: got {model!r}; expected a preset name, a config.json path, a dict of "
                     "[model] keys (num_layers=..., ...) or a sim.inputs.model.ModelSpec")


def _base(experiment, model, settings: dict, parser) -> tuple[Experiment | None, dict[str, Setting], object]:
    """The experiment file (if any) and the settings that every plan shares."""
    exp = read_experiment(experiment, parser) if experiment is not None else None
    base = dict(exp.settings) if exp else {}
    model_set, model_obj = _model_settings(model, parser)
    if model is not None:  # model= replaces the file's [model] as a whole
        from sim.inputs.experiment import TABLES

        base = {d: s for d, s in base.items() if d not in TABLES["model"]}
    base.update(model_set)
    base.update(settings_from_values(settings, parser))
    return exp, base, model_obj


def _check_model(exp: Experiment | None, settings: dict, model_obj) -> None:
    from sim.inputs.experiment import TABLES

    if model_obj is None and not any(d in TABLES["model"] and d != "seq_length" for d in settings):
        where = f"{exp.path}: " if exp else ""
        raise InputError(f"{where}model: missing; add a [model] table (preset = \"llama2-7b\", "
                         "hf_config = \"config.json\" or num_layers = ..., hidden_size = ...) or pass --model")


def _simulate(settings: dict[str, Setting], parser, extra_argv=(), model_obj=None, plan_obj=None,
              name: str = "", description: str = "") -> RunResult:
    ns = parser.parse_args(settings_argv(settings, parser) + list(extra_argv))
    training_run, summary = simulate_namespace(ns, model_obj, plan_obj)
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
    sim.errors.InputError: plan: tp: got 3; must divide num_attention_heads 32 of llama2-7b...
    """
    from sim.progress import Progress

    parser = _parser()
    exp, base, model_obj = _base(experiment, model, settings, parser)
    plan_set, plan_obj = _plan_settings(plan, parser)
    if isinstance(plan, str):
        if exp is None:
            raise InputError(f"plan: got {plan!r}; a plan name needs an experiment file with [[plans]]")
        entry = exp.plan(plan)
        base = {**base, **entry.settings, **settings_from_values(settings, parser)}
    elif exp is not None and exp.plans:
        raise InputError(f"{exp.path}: plans: the file lists {len(exp.plans)} plans "
                         f"({', '.join(p.name for p in exp.plans)}); pass plan=NAME, or use sim.compare")
    base.update(plan_set)
    _check_model(exp, base, model_obj)
    with Progress(enabled=progress) as bar:
        bar.update("simulating")
        try:
            return _simulate(base, parser, model_obj=model_obj, plan_obj=plan_obj,
                             name=plan if isinstance(plan, str) else "")
        except InputError as exc:
            if exp is None:
                raise
            from sim.inputs.experiment import blame

            raise blame(exc, exp.path, base) from None


def compare(experiment: str | Path | None = None, plans: list | None = None, *, model=None,
            schedules: list[str] | None = None, zero_stages: list[int] | None = None,
            progress: bool | None = False, **settings) -> Comparison:
    """Simulate several plans on one model and cluster; returns a ``Comparison``.

    The plans are the experiment file's ``[[plans]]``, or ``plans`` (dicts of [plan] keys
    with a ``"name"``, or ``ParallelPlan``s), each also run under every value of
    ``schedules`` and ``zero_stages`` when given (alone, those vary one base plan).
    Other keywords are as for ``run`` and apply to every plan.

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

    parser = _parser()
    exp, base, model_obj = _base(experiment, model, settings, parser)
    variants = variants_of(exp, plans, parser, schedules, zero_stages)
    keywords = settings_from_values(settings, parser)
    # Keywords override the file's plans; plans given here override the keywords.
    merged = [({**base, **v.settings, **keywords, **v.axis} if v.from_file else {**base, **v.settings, **v.axis})
              for v in variants]
    if variants:
        _check_model(exp, merged[0], model_obj)
    for v, m in zip(variants, merged):  # every plan's input errors before anything is simulated
        check_variant(exp, v, m, parser, (), model_obj)
    results = []
    with Progress(total=len(variants), enabled=progress) as bar:
        for i, (v, m) in enumerate(zip(variants, merged)):
            gpus = f"{results[0].summary['gpus']} GPUs, " if results else ""
            bar.update(f"simulating {gpus}plan {i + 1}/{len(variants)} ({v.name})", done=i)
            results.append(simulate_variant(exp, v, m, parser, (), model_obj))
    return Comparison(results)


def simulate_variant(exp, v: Variant, settings: dict, parser, extra_argv=(), model_obj=None) -> RunResult:
    """Simulate one plan of a comparison; an input error names the plan (and its line)."""
    try:
        return _simulate(settings, parser, extra_argv, model_obj, v.plan, v.name, v.description)
    except InputError as exc:
        raise _in_plan(exc, exp, v) from None


def check_variant(exp, v: Variant, settings: dict, parser, extra_argv=(), model_obj=None) -> None:
    """Check one plan of a comparison without simulating it (errors as ``simulate_variant``'s),
    so that a bad third plan is reported before the first is simulated."""
    try:
        ns = parser.parse_args(settings_argv(settings, parser) + list(extra_argv))
        prepare_namespace(ns, model_obj, v.plan)
    except InputError as exc:
        raise _in_plan(exc, exp, v) from None


def _in_plan(exc: InputError, exp, v: Variant) -> InputError:
    loc = f"{exp.path}:{v.line}: " if exp is not None and v.line else ""
    return InputError(f"{loc}plan {v.name!r}: {exc}")


def _title(results: list[RunResult]) -> str:
    if not results:
        return ""
    s = results[0].summary
    return f"{s['model']} on {s['gpus']} x {s['gpu']} ({s['topology']}): {len(results)} plans"
