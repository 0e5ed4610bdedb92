"""Transformer Engine's tensor-parallel overlap method per GEMM (``--tp-comm-overlap-cfg``).

With ``--tp-comm-overlap`` Transformer Engine overlaps each sequence-parallel collective
with a GEMM through its userbuffers (``transformer_engine/pytorch/module/base.py``,
``initialize_ub``), and a configuration (Megatron-LM's ``--tp-comm-overlap-cfg``, NeMo's
``tp_comm_overlap_cfg``, Transformer Engine's ``ub_cfgs``) picks, for each of ten GEMMs, the
method and the SMs its communication takes:

    qkv_fprop, fc1_fprop, proj_dgrad, fc2_dgrad   all-gather → GEMM: ring_exchange
    proj_fprop, fc2_fprop                         GEMM → reduce-scatter: pipeline or ring_exchange
    qkv_dgrad, fc1_dgrad                          the all-gather of the weight gradient's input,
                                                  beside the input-gradient GEMM: bulk
    qkv_wgrad, fc1_wgrad                          the input gradient's reduce-scatter, beside
                                                  the weight-gradient GEMM: bulk

What each method holds of the GPU (TE v2.0 ``transformer_engine/common/comm_gemm_overlap/``
``comm_gemm_overlap.cpp`` and ``userbuffers/userbuffers.cu``):

- ``ring_exchange``: the chunks move peer to peer with ``userbuffers_send``, which with
  ``use_ce`` (the default of every TE release, and of every configuration here) is a
  ``cudaMemcpyAsync`` on the copy engines plus a one-thread signal kernel: no SMs. A
  reduce-scatter by ring exchange computes the GEMM in tp chunks, sends each partial chunk
  to its owner, and ends with a reduction kernel over the tp received chunks on the main
  stream (``reduce_bf16`` / ``reduce_fp8_in_bf16_out``). ``aggregate`` sends two chunks a
  step, so an all-gather's GEMM runs in tp/2 chunks.
- ``pipeline``: the GEMM in ``num_splits`` chunks, each chunk's reduce-scatter a userbuffers
  kernel (``reducescatter2_userbuff_stridedoutput``) of ``num_sm`` thread blocks.
- ``bulk``: the whole collective as one userbuffers kernel of ``num_sm`` thread blocks
  (``allgather2_userbuff_inplace`` / ``reducescatter2_userbuff_inplace``) beside the GEMM.
- ``set_sm_margin``: the GEMMs of the overlap are launched on ``sm_count − num_sm`` SMs
  (``_math_sms``), leaving the communication its SMs whether it runs or not.

So a GEMM beside an overlap loses ``num_sm`` SMs (``sms_held``): always with a margin, and
while the communication kernel runs without one (pipeline and bulk; trainsim charges the
whole GEMM, as the configurations size the kernels to run about as long as the GEMM beside
them); a ring exchange without a margin costs the GEMM nothing. ``sim.program.tp`` prices
such a GEMM on ``sm_count − sms_held`` SMs (peak and waves, ``margin_profile``), and the
engine then does not also slow it (``overlap_compute_slowdown`` stays for NCCL's kernels).
Not modelled: HBM traffic the communication kernels add beside the GEMM, ``cga_size``,
``fp8_buf`` (reduce-scatters move 16-bit values), atomic GEMMs, and ``qkv_dgrad`` /
``fc1_dgrad`` with a method other than bulk (LoRA's configurations).

Values of the setting: a configuration by name (``CONFIGS``: Transformer Engine's defaults,
``te-1`` for releases 1.x and ``te-2`` for 2.x, and the configurations NeMo's recipes and
NVIDIA's benchmarks ran), or entries ``GEMM=METHOD[:NUM_SM][:margin][:aggregate][:splits=N]``
separated by commas, after an optional name they change (default ``te-2``). Without the
setting trainsim keeps its older model: TE's default methods, and GEMMs slowed by
``overlap_compute_slowdown`` while a reduce-scatter chunk is in flight.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import lru_cache

from sim.errors import InputError

FIELD = "tp_comm_overlap_cfg"
AG_GEMMS = ("qkv_fprop", "fc1_fprop", "proj_dgrad", "fc2_dgrad")
RS_GEMMS = ("proj_fprop", "fc2_fprop")
BULK_GEMMS = ("qkv_dgrad", "qkv_wgrad", "fc1_dgrad", "fc1_wgrad")
GEMMS = AG_GEMMS + RS_GEMMS + BULK_GEMMS
METHODS = ("ring_exchange", "pipeline", "bulk")
ALLOWED = {**{g: ("ring_exchange",) for g in AG_GEMMS}, **{g: ("pipeline", "ring_exchange") for g in RS_GEMMS},
           **{g: ("bulk",) for g in BULK_GEMMS}}
"""The methods each GEMM may take here (TE refuses ``pipeline`` for an all-gather)."""


@dataclass(frozen=True)
class Overlap:
    """One GEMM's overlap: Transformer Engine's ``method``, ``num_sm``, ``set_sm_margin``,
    ``aggregate`` (ring exchange) and ``num_splits`` (pipeline)."""

    method: str
    num_sm: int
    set_sm_margin: bool = False
    aggregate: bool = False
    num_splits: int = 4

    @property
    def sms_held(self) -> int:
        """SMs the GEMM beside this overlap loses (module doc)."""
        if self.method == "ring_exchange":
            return self.num_sm if self.set_sm_margin else 0
        return self.num_sm


def _te_defaults(margin: bool) -> dict:
    ring, other = Overlap("ring_exchange", 1), Overlap("pipeline", 16, margin)
    return {**{g: ring for g in AG_GEMMS}, **{g: other for g in RS_GEMMS},
            **{g: Overlap("bulk", 16, margin) for g in BULK_GEMMS}}


_NEMO_B200_TP2 = ("qkv_fprop=ring_exchange:1,proj_dgrad=ring_exchange:1,fc1_fprop=ring_exchange:1,"
                  "fc2_dgrad=ring_exchange:1,")
_NEMO_AGG = ("qkv_fprop=ring_exchange:1:aggregate,proj_dgrad=ring_exchange:1:aggregate,"
             "fc1_fprop=ring_exchange:1:aggregate,fc2_dgrad=ring_exchange:1:aggregate,")
_RS_RING = "proj_fprop=ring_exchange:1:margin,fc2_fprop=ring_exchange:1:margin"
CONFIGS = {
    # name: (entries over te-2, or None for a base of its own; source)
    "te-1": (None, "Transformer Engine 1.x's defaults (v1.10, v1.11, v1.13: transformer_engine/pytorch/module/"
                   "base.py, initialize_ub, get_default_config): ring_exchange with 1 SM for the all-gathers, "
                   "pipeline with 16 SMs (4 splits) for the forward reduce-scatters, bulk with 16 SMs, no SM margin"),
    "te-2": (None, "Transformer Engine 2.x's defaults (v2.0, v2.1: the same file): as 1.x, but set_sm_margin for "
                   "pipeline and bulk (`not method == 'ring_exchange'`)"),
    "userbuffers_fp8_b200_h8192_tp2_mbs1_seqlen8192": (
        "qkv_dgrad=bulk:4,qkv_wgrad=bulk:24,fc1_dgrad=bulk:2,fc1_wgrad=bulk:4," + _NEMO_B200_TP2 + _RS_RING,
        "NVIDIA/NeMo @ d3f25b121048 nemo/collections/llm/recipes/tp_overlap_configs/userbuffers.py (Llama 3 70B on "
        "B200 in FP8, scripts/performance/llm/pretrain_llama3_70b.py)"),
    "userbuffers_bf16_b200_h8192_tp2_mbs1_seqlen8192": (
        "qkv_dgrad=bulk:16,qkv_wgrad=bulk:24,fc1_dgrad=bulk:2,fc1_wgrad=bulk:4," + _NEMO_B200_TP2
        + "proj_fprop=pipeline:32:margin,fc2_fprop=pipeline:16:margin",
        "the same file (Llama 3 70B on B200 in BF16)"),
    "userbuffers_fp8_b200_h16384_tp4_cp2_mbs1_seqlen8192": (
        "qkv_dgrad=bulk:8,qkv_wgrad=bulk:32,fc1_dgrad=bulk:2,fc1_wgrad=bulk:8," + _NEMO_AGG + _RS_RING,
        "the same file (Llama 3.1 405B on B200 in FP8, scripts/performance/llm/pretrain_llama31_405b.py)"),
    "userbuffers_bf16_b200_h16384_tp4_cp2_mbs1_seqlen8192": (
        "qkv_dgrad=bulk:8,qkv_wgrad=bulk:24,fc1_dgrad=bulk:2,fc1_wgrad=bulk:2," + _NEMO_AGG
        + "proj_fprop=pipeline:32:margin,fc2_fprop=pipeline:8:margin",
        "the same file (Llama 3.1 405B on B200 in BF16)"),
    "userbuffers_fp8_h100_h8192_tp4_mbs1_seqlen8192": (
        "qkv_dgrad=bulk:4,qkv_wgrad=bulk:24,fc1_dgrad=bulk:2,fc1_wgrad=bulk:4," + _NEMO_B200_TP2
        + "proj_fprop=pipeline:24:margin,fc2_fprop=pipeline:16:margin",
        "the same file (Llama 3 70B on H100; BF16's userbuffers_bf16_h100_h8192_tp4_mbs1_seqlen8192 has the same "
        "methods and SMs)"),
    "userbuffers_fp8_h100_h16384_tp8_cp2_mbs1_seqlen8192": (
        "qkv_dgrad=bulk:2,qkv_wgrad=bulk:24,fc1_dgrad=bulk:2,fc1_wgrad=bulk:2," + _NEMO_AGG
        + "proj_fprop=pipeline:24:margin,fc2_fprop=pipeline:8:margin",
        "the same file (Llama 3.1 405B on H100; BF16's userbuffers_bf16_h100_h16384_tp8_cp2_mbs1_seqlen8192 has "
        "the same methods and SMs)"),
    "dgxc-25.02-gpt3-175b": (
        "qkv_dgrad=bulk:4,qkv_wgrad=bulk:8,fc1_dgrad=bulk:2,fc1_wgrad=bulk:4,qkv_fprop=ring_exchange:1,"
        "proj_dgrad=ring_exchange:1,fc1_fprop=ring_exchange:1,fc2_dgrad=ring_exchange:1:aggregate,"
        "proj_fprop=pipeline:24:margin,fc2_fprop=pipeline:20:margin",
        "NVIDIA/dgxc-benchmarking v25.02 nemo_megatron/gpt3_175b_hydra.yaml, ub_tp_comm_overlap_cfg (the ring "
        "exchanges' num_sm and margin are TE's defaults: 1, none)"),
    "dgxc-25.02-llama3.1-405b": (
        "qkv_dgrad=bulk:2,qkv_wgrad=bulk:24,fc1_dgrad=bulk:2,fc1_wgrad=bulk:2," + _NEMO_AGG
        + "proj_fprop=pipeline:24:margin,fc2_fprop=pipeline:8:margin",
        "NVIDIA/dgxc-benchmarking v25.02 llama3.1/llama3.1_405b.yaml, ub_tp_comm_overlap_cfg"),
}
"""Configurations by name, each as entries over ``te-2`` (every method, SM count and
margin is given, so the base only fills what these leave out) and its source."""
DEFAULT_BASE = "te-2"


def _refuse(value, allowed: str) -> InputError:
    return InputError(field=f"plan: {FIELD}", value=value, allowed=allowed, setting=FIELD)


def _entry(text: str) -> tuple[str, Overlap]:
    gemm, eq, rest = text.partition("=")
    gemm = gemm.strip()
    if not eq or gemm not in GEMMS:
        raise _refuse(text, f"expected a configuration name ({', '.join(CONFIGS)}) or GEMM=METHOD[:NUM_SM]"
                            f"[:margin][:aggregate][:splits=N] with GEMM one of {', '.join(GEMMS)}")
    method, *opts = [p.strip() for p in rest.split(":")]
    if method not in ALLOWED[gemm]:
        raise _refuse(text, f"{gemm} takes {' or '.join(ALLOWED[gemm])} here")
    cfg = Overlap(method, 1 if method == "ring_exchange" else 16)
    for o in opts:
        if o.isdigit() and int(o) > 0:
            cfg = replace(cfg, num_sm=int(o))
        elif o == "margin":
            cfg = replace(cfg, set_sm_margin=True)
        elif o == "aggregate" and method == "ring_exchange":
            cfg = replace(cfg, aggregate=True)
        elif o.startswith("splits=") and o[7:].isdigit() and int(o[7:]) > 0 and method == "pipeline":
            cfg = replace(cfg, num_splits=int(o[7:]))
        else:
            raise _refuse(text, f"options after the method: an SM count > 0, margin, aggregate (ring_exchange) or "
                                f"splits=N (pipeline); got {o!r}")
    return gemm, cfg


@lru_cache(maxsize=64)
def parse(value: str) -> tuple[tuple[str, Overlap], ...]:
    """The ten GEMMs' overlaps of a setting's value (module doc), in ``GEMMS`` order."""
    if not isinstance(value, str) or not value.strip():
        raise _refuse(value, "expected a configuration name or GEMM=METHOD entries")
    items = [p.strip() for p in value.split(",") if p.strip()]
    base = DEFAULT_BASE
    if items and "=" not in items[0]:
        base = items.pop(0)
        if base not in CONFIGS:
            raise _refuse(base, f"allowed names: {', '.join(CONFIGS)}; or GEMM=METHOD entries")
    entries, _ = CONFIGS[base]
    out = _te_defaults(base != "te-1")
    if entries is not None:
        out.update(dict(_entry(e) for e in entries.split(",")))
    out.update(dict(_entry(e) for e in items))
    return tuple((g, out[g]) for g in GEMMS)


def overlaps(value: str | None) -> dict[str, Overlap] | None:
    """``parse``'s table as a dict, or None without the setting (trainsim's older model)."""
    return None if value is None else dict(parse(value))


def margin_profile(profile, sms_held: int):
    """``profile`` with ``sms_held`` of its SMs taken: its peaks scaled by the SMs left and
    its GEMMs' waves over them (what a GEMM launched with an SM margin runs on)."""
    if not sms_held:
        return profile
    return _margin(profile, sms_held)


@lru_cache(maxsize=32)
def _margin(profile, sms_held: int):
    left = profile.sm_count - sms_held
    if left < 1:
        raise InputError(field=f"plan: {FIELD}", value=sms_held, setting=FIELD,
                         allowed=f"an overlap's SMs must leave the GEMM some of the GPU's {profile.sm_count}")
    share = left / profile.sm_count
    return replace(profile, sm_count=left, peak_flops={k: v * share for k, v in profile.peak_flops.items()})
