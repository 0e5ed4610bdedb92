"""Goodput over a training campaign: failures, checkpoints and restarts over days.

A training job of thousands of GPUs is interrupted every few hours (Llama 3 405B on
16,384 H100s: 419 unexpected interruptions in 54 days). Between interruptions it trains
at the simulated step time and saves checkpoints; each failure costs its detection, a
restart (and a wait for a spare node, or for the repair) and the work done since the last
durable checkpoint. This package simulates that life with SimPy and answers: what
fraction of the wall time is useful training (goodput), what each cause costs, and how
often to checkpoint.

- ``failures``: causes with rates per device-hour, device kinds and costs; TOML presets
  (``presets/llama3.toml``) and files;
- ``sim.engine.checkpoint_cycle``: training with periodic (synchronous or asynchronous)
  saves, as arithmetic; ``sim.engine.campaign``: the SimPy model (failure arrivals per
  cause, the job, hot spares), in the engine with the other SimPy model;
- ``timeline``: a recorded campaign as spans and points for pictures;
- ``optimum``: Young's and Daly's optimum intervals, Daly's expected goodput, and the
  search for the best interval by simulation;
- ``study``: checkpoint bytes and times from the memory model, device counts, and the report.
"""

from sim.engine.campaign import Campaign, CampaignConfig, simulate_campaign
from sim.studies.goodput.failures import DEVICE_KINDS, Cause, FailureModel, device_counts, load_failures, preset_names
from sim.studies.goodput.optimum import daly_goodput, daly_interval_s, search_interval, young_interval_s
from sim.inputs.schema_commands import DEFAULT_STORAGE_BPS  # (the default of goodput's --storage-bandwidth)
from sim.studies.goodput.study import Checkpoint, Study, checkpoint_of, run_study

__all__ = ["Campaign", "CampaignConfig", "simulate_campaign", "DEVICE_KINDS", "Cause", "FailureModel", "device_counts",
           "load_failures", "preset_names", "daly_goodput", "daly_interval_s", "search_interval", "young_interval_s",
           "DEFAULT_STORAGE_BPS", "Checkpoint", "Study", "checkpoint_of", "run_study"]
