"""Failure rates: what interrupts a training job, how often, and what each interruption costs.

A failure model is a list of *causes*. Each cause has a rate per device-hour and the kind
of device it strikes, so that a job's rate of that cause is the rate times the job's
devices of that kind:

    gpu      the job's GPUs
    node     its hosts (servers)
    nic      its network adapters
    switch   the fabric's switches
    job      the job itself (one: a rate per job-hour, whatever the job's size)

and the times an interruption costs: ``detect_s`` (from the failure until the job is
known to have stopped), ``restart_s`` (relaunching the job; reading the checkpoint back
is added from the checkpoint's size), and, for a cause that takes a node out of the job
(``replace``), ``repair_s``: the time before the failed node can serve again. A
*planned* cause (maintenance) stops the job on purpose: it saves a checkpoint first,
loses no work and spends no detection time.

Models are TOML files; built-in presets live in ``presets/`` (``llama3``: the Llama 3
paper's interruption table). Rates are inputs, never results: a preset's file names its
source. The file format::

    [preset]              # optional: name, description, source
    [observed]            # optional: the basis a cause's `count` is turned into a rate with
    hours = 1296          #   observation hours, and the devices of each kind observed
    gpu = 16384
    [defaults]            # optional: detect_s, restart_s, repair_s for every cause
    [causes.NAME]         # one table per cause
    device = "gpu"        #   gpu, node, nic, switch or job
    count = 148           #   failures seen in [observed]  -- or --
    rate_per_device_hour = 2.5e-7
    label, category, detect_s, restart_s, repair_s, replace (bool), planned (bool)

Unknown keys, unknown device kinds and negative rates are errors naming the key.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from sim.errors import InputError
from sim.inputs.tomlio import TomlFile

DEVICE_KINDS = ("gpu", "node", "nic", "switch", "job")
HOUR_S = 3600.0

DEFAULTS = {
    "detect_s": 600.0,
    # PyTorch's default NCCL process-group timeout, 10 minutes (torch.distributed.
    # init_process_group docs): a rank that dies leaves the others blocked in a collective
    # until the watchdog fires. Health checks that catch a failure sooner: lower it.
    "restart_s": 600.0,
    # Assumption (no published source): rescheduling, process start, NCCL communicator
    # set-up and data-loader warm-up of a large job. FlashRecovery (Zhang et al. 2025)
    # reports restoring 4,800 devices in 150 s with a purpose-built recovery system.
    "repair_s": 86400.0,
    # Assumption (no published source): a day to diagnose a node and swap the part.
}
"""The cost of an interruption when neither the cause nor the file's [defaults] says."""

_CAUSE_KEYS = {"label", "category", "device", "count", "rate_per_device_hour", "detect_s", "restart_s", "repair_s",
               "replace", "planned"}


@dataclass(frozen=True)
class Cause:
    """One root cause of interruptions, with its rate and its costs (SI units)."""

    name: str
    device: str
    rate_per_device_s: float
    detect_s: float
    restart_s: float
    repair_s: float
    replace: bool
    """Takes a node out of the job: a hot spare replaces it, or the job waits for the repair."""
    planned: bool = False
    label: str = ""
    category: str = ""

    def job_rate_per_s(self, counts: dict[str, int]) -> float:
        """This cause's failures per second for a job with ``counts`` devices of each kind."""
        return self.rate_per_device_s * counts[self.device]


@dataclass(frozen=True)
class FailureModel:
    """A named set of causes (a preset or a file)."""

    name: str
    causes: tuple[Cause, ...]
    description: str = ""
    source: str = ""

    def rates_per_s(self, counts: dict[str, int], planned: bool | None = None) -> dict[str, float]:
        """Each cause's failures per second for the job (only planned or unplanned causes
        when ``planned`` is True or False)."""
        return {c.name: c.job_rate_per_s(counts) for c in self.causes if planned is None or c.planned == planned}

    def mtbf_s(self, counts: dict[str, int]) -> float:
        """The job's mean time between unexpected interruptions (inf without any)."""
        total = sum(self.rates_per_s(counts, planned=False).values())
        return 1.0 / total if total > 0 else math.inf

    def scaled(self, factor: float) -> FailureModel:
        """The same causes with every rate times ``factor`` (what-if studies)."""
        if not (factor >= 0 and math.isfinite(factor)):
            raise InputError(f"factor: got {factor!r}; expected a finite number >= 0")
        causes = tuple(Cause(**{**c.__dict__, "rate_per_device_s": c.rate_per_device_s * factor}) for c in self.causes)
        return FailureModel(self.name, causes, self.description, self.source)


def preset_names() -> list[str]:
    """The built-in failure presets (files ``presets/NAME.toml`` of this package)."""
    folder = resources.files(__package__).joinpath("presets")
    return sorted(p.name[:-5] for p in folder.iterdir() if p.name.endswith(".toml"))


def load_failures(name_or_path: str, flag: str = "--failures") -> FailureModel:
    """A failure model from a preset name (``llama3``) or a TOML file."""
    text = str(name_or_path)
    if text in preset_names():
        with resources.as_file(resources.files(__package__).joinpath("presets", f"{text}.toml")) as path:
            return parse_failures(TomlFile(path), default_name=text)
    if not text.endswith(".toml"):
        raise InputError(f"{flag}: got {text!r}; allowed: {', '.join(preset_names())} or a failures .toml file")
    path = Path(text)
    if not path.is_file():
        raise InputError(f"{flag}: got {text!r}; no such file (expected a preset, {', '.join(preset_names())}, "
                         "or a failures .toml file)")
    return parse_failures(TomlFile(path), default_name=path.stem)


def parse_failures(f: TomlFile, default_name: str = "custom") -> FailureModel:
    """Check a parsed failures file strictly and build its model (see the module doc)."""
    data = f.data
    f.check_keys(data, {"preset", "observed", "defaults", "causes"}, "", required=("causes",))
    meta = f.table(data, "preset")
    f.check_keys(meta, {"name", "description", "source"}, "preset.")
    name = f.string(meta, "name", "preset.", default=default_name)
    observed = f.table(data, "observed")
    f.check_keys(observed, {"hours", *DEVICE_KINDS}, "observed.")
    for key in observed:
        f.number(observed, key, "observed.", positive=True)
    defaults_t = f.table(data, "defaults")
    f.check_keys(defaults_t, set(DEFAULTS), "defaults.")
    defaults = {k: f.number(defaults_t, k, "defaults.", minimum=0, default=v) for k, v in DEFAULTS.items()}
    causes_t = f.table(data, "causes")
    if not causes_t:
        raise f.error("causes", "no cause given; expected at least one [causes.NAME] table")
    causes = [_cause(f, cname, table, observed, defaults) for cname, table in causes_t.items()]
    return FailureModel(name, tuple(causes), f.string(meta, "description", "preset.", default=""),
                        f.string(meta, "source", "preset.", default=""))


def _cause(f: TomlFile, name: str, t, observed: dict, defaults: dict) -> Cause:
    p = f"causes.{name}."
    if not isinstance(t, dict):
        raise f.error(f"causes.{name}", f"got {t!r}; expected a table [causes.{name}]")
    f.check_keys(t, _CAUSE_KEYS, p, required=("device",))
    device = f.string(t, "device", p, choices=DEVICE_KINDS)
    given = [k for k in ("count", "rate_per_device_hour") if k in t]
    if len(given) != 1:
        raise f.error(f"causes.{name}", f"got {' and '.join(given) or 'neither count nor rate_per_device_hour'}; "
                                        "give exactly one of count (with [observed]) or rate_per_device_hour")
    if given == ["count"]:
        count = f.number(t, "count", p, minimum=0)
        for key in ("hours", device):
            if key not in observed:
                raise f.error(f"causes.{name}.count", f"needs observed.{key} (the {'hours' if key == 'hours' else key + ' devices'} "
                                                      "the count was seen over) in an [observed] table")
        rate_per_hour = count / (observed[device] * observed["hours"])
    else:
        rate_per_hour = f.number(t, "rate_per_device_hour", p, minimum=0)
    flags = {}
    for key, default in (("replace", device in ("gpu", "node", "nic")), ("planned", False)):
        v = t.get(key, default)
        if not isinstance(v, bool):
            raise f.error(f"{p}{key}", f"got {v!r}; expected true or false")
        flags[key] = v
    costs = {k: f.number(t, k, p, minimum=0, default=defaults[k]) for k in DEFAULTS}
    return Cause(name, device, rate_per_hour / HOUR_S, costs["detect_s"], costs["restart_s"], costs["repair_s"],
                 flags["replace"] and not flags["planned"], flags["planned"],
                 f.string(t, "label", p, default=name), f.string(t, "category", p, default=""))


def device_counts(topology, gpus: int) -> dict[str, int]:
    """The job's devices of each kind: its ``gpus`` GPUs, the hosts they sit in, and the
    NICs and switches of the topology (built for the job, so its devices are the job's)."""
    kinds: dict[str, int] = {}
    for _, d in topology.graph.nodes(data=True):
        kinds[d["kind"]] = kinds.get(d["kind"], 0) + 1
    hosts = {topology.node_of(r) for r in range(gpus)}
    nics_per_host = kinds.get("nic", 0) / max(1, topology.num_nodes)
    return {"gpu": gpus, "node": len(hosts), "nic": int(round(nics_per_host * len(hosts))),
            "switch": kinds.get("switch", 0), "job": 1}
