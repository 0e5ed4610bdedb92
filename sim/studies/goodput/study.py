"""A goodput study: from a training run and a failure model to a campaign and its report.

The pieces a campaign needs, each from one place:

- the step time: one simulated iteration of the plan (``sim.session``), or given;
- the checkpoint: every parameter's 16-bit weight and its optimizer states (fp32 master
  weight, Adam's momentum and variance: 2 + 12 bytes per parameter, the memory model's
  ``model_state_bytes``; gradients are not saved). Each shard is written once, as
  Megatron-LM's distributed checkpoint does: data-parallel replicas split the writing of
  their identical states instead of each writing a copy, so every GPU writes ``1/world``
  of the bytes and the storage's aggregate bandwidth, shared by all writers, sets the
  time: ``write_s = bytes / storage_Bps``. Reading it back at a restart takes as long
  (``load_s``). An asynchronous save stalls training only while each GPU copies its
  shard to host memory over PCIe (the profile's ``pcie`` link, bandwidth × efficiency);
- the devices: the job's GPUs, hosts, NICs and switches (``failures.device_counts``);
- the failure model's causes at the job's rates.

``run_study`` searches the checkpoint interval (``optimum.search_interval``), runs the
campaign at the interval asked for (``auto``: the best found), and reports goodput,
interruptions and time lost by cause next to Young's and Daly's closed forms.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from sim.errors import InputError
from sim.program.api import model_state_bytes
from sim.engine.campaign import LOSS_KINDS, CampaignConfig, simulate_campaign
from sim.studies.goodput.failures import FailureModel
from sim.studies.goodput.optimum import SEARCH_FAILURES, daly_goodput, daly_interval_s, search_interval, \
    young_interval_s

DAY_S = 86400.0


@dataclass(frozen=True)
class Checkpoint:
    """What one checkpoint costs (bytes and seconds)."""

    bytes: float
    per_gpu_bytes: float
    write_s: float
    """All of it to storage: bytes / aggregate storage bandwidth."""
    copy_s: float
    """One GPU's shard to host memory (an asynchronous save's stall)."""
    asynchronous: bool

    @property
    def stall_s(self) -> float:
        return self.copy_s if self.asynchronous else self.write_s

    @property
    def background_s(self) -> float:
        return self.write_s if self.asynchronous else 0.0

    @property
    def load_s(self) -> float:
        return self.write_s


def checkpoint_of(num_params: float, world_size: int, storage_Bps: float, host_copy_Bps: float,
                  asynchronous: bool = False) -> Checkpoint:
    """The checkpoint of a model of ``num_params`` parameters trained on ``world_size`` GPUs."""
    for name, v in (("--storage-bandwidth", storage_Bps), ("host copy bandwidth", host_copy_Bps)):
        if not (v > 0 and math.isfinite(v)):
            raise InputError(f"{name}: got {v!r}; expected a finite number of bytes/s > 0")
    states = model_state_bytes(num_params)
    total = states.params_bytes + states.optimizer_bytes
    per_gpu = total / world_size
    return Checkpoint(total, per_gpu, total / storage_Bps, per_gpu / host_copy_Bps, asynchronous)


@dataclass(frozen=True)
class Study:
    """Everything a campaign is built from, except the checkpoint interval."""

    step_time_s: float
    checkpoint: Checkpoint
    failures: FailureModel
    devices: dict
    horizon_s: float
    spares: int | None = None

    def __post_init__(self):
        if not (self.step_time_s > 0 and math.isfinite(self.step_time_s)):
            raise InputError(f"--step-time-s: got {self.step_time_s!r}; expected a finite number of seconds > 0")
        if not (self.horizon_s > 0 and math.isfinite(self.horizon_s)):
            raise InputError(f"--days: got {self.horizon_s / DAY_S!r}; expected a finite number of days > 0")

    def rates_per_s(self) -> dict[str, float]:
        return self.failures.rates_per_s(self.devices)

    def config(self, interval_s: float) -> CampaignConfig:
        rates = self.rates_per_s()
        ck = self.checkpoint
        return CampaignConfig(self.horizon_s, self.step_time_s, interval_s, ck.stall_s, ck.background_s,
                              ck.write_s, ck.load_s, tuple((c, rates[c.name]) for c in self.failures.causes),
                              self.spares)

    @property
    def mtbf_s(self) -> float:
        return self.failures.mtbf_s(self.devices)

    @property
    def mean_restart_s(self) -> float:
        """Detection + restart + reading the checkpoint back, averaged over the unexpected
        causes by rate (Daly's R; waits for spares left out)."""
        rates = self.failures.rates_per_s(self.devices, planned=False)
        total = sum(rates.values())
        if total <= 0:
            return 0.0
        return sum(rates[c.name] * (c.detect_s + c.restart_s) for c in self.failures.causes
                   if not c.planned) / total + self.checkpoint.load_s

    def guess_s(self) -> float:
        """Where the interval search centres its grid: Daly's optimum, at least one step and
        (asynchronous saves) the background write."""
        m = self.mtbf_s
        daly = daly_interval_s(self.checkpoint.stall_s, m) if math.isfinite(m) else self.horizon_s
        return max(daly, self.step_time_s, self.checkpoint.background_s)


def run_study(study: Study, interval_s: float | None = None, seed: int = 0, record: bool = True,
              min_failures: float = SEARCH_FAILURES) -> tuple[dict, object]:
    """Search the interval (over a horizon of ``min_failures`` expected failures), run the
    campaign at ``interval_s`` (None: the best found) and return (the JSON report, the
    campaign)."""
    search = search_interval(study.config, study.guess_s(), seeds=(seed,), min_failures=min_failures)
    used = search.best_interval_s if interval_s is None else interval_s
    cfg = study.config(used)
    camp = simulate_campaign(cfg, seed, record=record)
    return report(study, cfg, camp, search, seed, auto=interval_s is None), camp


def report(study: Study, cfg: CampaignConfig, camp, search, seed: int, auto: bool) -> dict:
    m, ck = study.mtbf_s, study.checkpoint
    delta, r = ck.stall_s, study.mean_restart_s
    rates = study.rates_per_s()
    finite = math.isfinite(m)
    lost = {}
    for c in study.failures.causes:
        parts = {f"{k}_s": camp.lost[c.name][k] for k in LOSS_KINDS}
        lost[c.name] = {**parts, "total_s": sum(parts.values())}
    return {
        "goodput": camp.goodput,
        "useful_s": camp.useful_s,
        "wall_s": camp.horizon_s,
        "days": camp.horizon_s / DAY_S,
        "seed": seed,
        "unexpected_interruptions": camp.unexpected,
        "planned_interruptions": sum(camp.interruptions[c.name] for c in study.failures.causes if c.planned),
        "interruptions_by_cause": dict(camp.interruptions),
        "expected_interruptions_by_cause": {c.name: rates[c.name] * camp.horizon_s for c in study.failures.causes},
        "time_lost_by_cause_s": lost,
        "checkpoint_stall_s": camp.checkpoint_s,
        "checkpoints_durable": camp.saves_durable,
        "checkpoint_interval_s": cfg.cycle.interval_s,
        "checkpoint_interval_iterations": cfg.interval_steps,
        "checkpoint_interval_auto": auto,
        "best_checkpoint_interval_s": search.best_interval_s,
        "best_goodput": search.best_goodput,
        "search": {"points": [list(p) for p in search.points], "coarse_points": [list(p) for p in search.coarse],
                   "horizon_days": search.horizon_s / DAY_S},
        "young_interval_s": young_interval_s(delta, m) if finite else None,
        "daly_interval_s": daly_interval_s(delta, m) if finite else None,
        "young_daly_interval_s": daly_interval_s(delta, m) if finite else None,
        "young_daly_form": "Daly 2006 higher-order optimum",
        "daly_goodput_at_best": daly_goodput(search.best_interval_s, delta, m, r),
        "daly_goodput_at_interval": daly_goodput(cfg.cycle.interval_s, delta, m, r),
        "mtbf_s": m if finite else None,
        "mean_restart_s": r,
        "step_time_s": study.step_time_s,
        "checkpoint": {"bytes": ck.bytes, "per_gpu_bytes": ck.per_gpu_bytes, "write_s": ck.write_s,
                       "copy_to_host_s": ck.copy_s, "stall_s": delta, "load_s": ck.load_s,
                       "mode": "async" if ck.asynchronous else "sync"},
        "devices": dict(study.devices),
        "hot_spares": study.spares if study.spares is not None else "unlimited",
        "failures": {"name": study.failures.name, "source": study.failures.source,
                     "rates_per_device_hour": {c.name: c.rate_per_device_s * 3600.0 for c in study.failures.causes},
                     "devices": {c.name: c.device for c in study.failures.causes}},
    }
