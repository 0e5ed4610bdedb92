"""Cross-field rules: every check that relates one setting to another, in one module.

A field's own bounds are declared once, with the field (``setting(...)`` in
``sim.inputs.plan``; a strategy's names in its registry, ``sim.inputs.strategies``); the
rules that tie fields together live here and run once, before any program is built:

* ``check_plan(plan)``: the plan alone (``ParallelPlan.__post_init__`` calls it once the
  fields are normalised): tensor-parallel overlap, batch and pipeline rules, ZeRO's options,
  experts, CUDA graphs, context parallelism, the framework settings, recomputation.
* ``check_model(plan, model)``: what needs the model (``ParallelPlan.check_model``).
* ``check_cluster(plan, pinned, topology, where)``: what needs the resolved cluster
  (pinned groups inside NVLink domains, ``sim.session.prepare``); ``check_nccl_algo``: a
  forced NVLS needs NVLink SHARP on the topology; ``check_power_cap``: a power cap the GPU's
  profile allows (``sim.inputs.power.capped``).

The FP8 rules (``fp8_*`` in ``ParallelPlan.__post_init__``, ``sim.program.fp8.check_fp8_support``)
stay with the precision code for now, and the PXN settings with ``sim.inputs.topology.check_pxn``.
"""

from __future__ import annotations

from sim.errors import InputError, require
from sim.inputs.cuda_graphs import FIELD as _CUDA_GRAPH_FIELD, COVERS_MOE
from sim.inputs.frameworks import DEEPSPEED_ONLY, DEFAULT_FRAMEWORK
from sim.inputs.model import ModelSpec
from sim.inputs.pinning import check_pinned
from sim.inputs.recompute import EXPERT_MODULES, FIELD as _RECOMPUTE_FIELD, parse_recompute_modules
from sim.inputs.layer_split import FIRST, LAST, check_layer_split, check_layout
from sim.inputs.strategies import attention_named, recompute_named, schedule_named
from sim.inputs.topology import nvls_capable
from sim.inputs.tp_overlap import parse as parse_tp_overlap

__all__ = ["check_plan", "check_model", "check_cluster", "check_nccl_algo", "check_power_cap", "vpp_of_layout"]


def _check(cond: bool, field: str, value, allowed: str) -> None:
    """``require`` for the plan's attribute ``field`` (named as the user wrote it by the front end)."""
    require(cond, f"plan: {field}", value, allowed, setting=field)


def check_plan(plan) -> None:
    """Every rule between the plan's fields (its own bounds checked, its defaults filled in)."""
    _check(not plan.tp_comm_overlap or plan.tp == 1 or plan.sequence_parallel, "tp_comm_overlap", True,
           "needs sequence_parallel (it overlaps the sequence-parallel all-gathers and reduce-scatters with "
           "the GEMMs beside them)")
    _check(plan.tp_comm_overlap_cfg is None or plan.tp_comm_overlap, "tp_comm_overlap_cfg",
           plan.tp_comm_overlap_cfg, "needs tp_comm_overlap (the configuration of its overlap)")
    if plan.tp_comm_overlap_cfg is not None:
        parse_tp_overlap(plan.tp_comm_overlap_cfg)
    _check(plan.cross_entropy != "pytorch" or plan.tp == 1, "cross_entropy", plan.cross_entropy,
           "pytorch's cross entropy needs the whole vocabulary on one GPU (tp 1); use megatron or megatron-fused")
    _check(plan.cross_entropy_impl == "native" or plan.cross_entropy == "megatron-fused", "cross_entropy_fusion_impl",
           plan.cross_entropy_impl, "changes nothing without cross_entropy_loss_fusion (Megatron-Core runs its "
           "unfused loss); add --cross-entropy-loss-fusion or leave it native")
    attention_named(plan.attention)  # (the names each registry knows: the settings' choices)
    recompute_named(plan.recompute)
    check_recompute_plan(plan)
    per_step = plan.micro_batch_size * plan.dp
    _check(plan.global_batch_size % per_step == 0, "global_batch_size", plan.global_batch_size,
           f"must be a multiple of micro_batch_size x dp = {plan.micro_batch_size} x {plan.dp} = {per_step}")
    if plan.vpp > 1:
        _check(plan.pp > 1, "vpp", plan.vpp, "interleaving needs pp > 1")
    _check_schedule(plan)
    zero = plan.zero
    _check(not plan.param_gather_overlap or zero.gathers_after_step, "param_gather_overlap", True,
           f"needs zero 1 or 2 (got {plan.zero_stage}): it overlaps the sharded optimizer's parameter "
           "all-gather (ZeRO-3 gathers every layer before each use anyway)")
    _check(not (plan.param_gather_overlap and plan.offload_optimizer), "param_gather_overlap", True,
           "not with offload_optimizer (the parameters come back from the host)")
    _check(not plan.offload_optimizer or zero.shards_optimizer, "offload_optimizer", True,
           "needs ZeRO stage 1, 2 or 3 (the optimizer states offloaded are the sharded ones)")
    if plan.cpu_offloading_num_layers is not None:  # Megatron-Core's TransformerConfig.__post_init__ refuses these
        _check(plan.pp == 1, "cpu_offloading_num_layers", plan.cpu_offloading_num_layers,
               f"needs pp 1 (got {plan.pp}): Megatron-Core has no CPU offloading with pipeline parallelism")
        _check(not plan.recompute_policy.recomputes, "cpu_offloading_num_layers", plan.cpu_offloading_num_layers,
               f"needs recompute_granularity none (got {plan.recompute}): Megatron-Core's CPU offloading does not "
               "work with activation recomputation")
        _check(plan.cuda_graph is None, "cpu_offloading_num_layers", plan.cpu_offloading_num_layers,
               "not with cuda_graph: Megatron-Core refuses CUDA graphs with CPU offloading")
    _check_uneven(plan)
    check_expert_plan(plan)
    check_ep_overlap_plan(plan)
    check_cuda_graph_plan(plan)
    check_context_plan(plan)
    check_framework_plan(plan)


def check_model(plan, model) -> None:
    """Checks that need the model: each factor must split the layer it cuts, and the
    layers must split over the (virtual) pipeline stages."""
    plan.stage_layers(model)
    if model.layers is not None:  # each layer kind's own tensor/context-parallel rules (sim.inputs.layers)
        for lay in model.layer_kinds:
            for kind in lay.blocks:
                kind.check_plan(model, plan)
    else:
        for field, value in (("num_attention_heads", model.num_attention_heads),
                             ("num_key_value_heads", model.num_key_value_heads),
                             ("ffn_hidden_size", model.ffn_hidden_size)):
            _check(value % plan.tp == 0, "tp", plan.tp, f"must divide {field} {value} of {model.name}")
    n = plan.cpu_offloading_num_layers
    _check(n is None or n < model.num_layers, "cpu_offloading_num_layers", n,
           f"must be less than num_layers {model.num_layers} (Megatron-Core's rule)")
    check_expert_model(plan, model)
    check_context_model(plan, model)
    check_recompute_model(plan, model)
    check_recompute_layers(plan, model)
    check_cuda_graph_model(plan, model)
    check_deepspeed_model(plan, model)


def vpp_of_layout(plan) -> int:
    """A pipeline layout of pp·k stages sets vpp = k; a vpp given beside it must agree."""
    vpp = check_layout(plan)
    _check(plan.vpp in (1, vpp), "vpp", plan.vpp,
           f"the pipeline layout's {vpp * plan.pp} stages over pp = {plan.pp} make vpp {vpp}; give one or "
           "the other")
    return vpp


def _check_schedule(plan) -> None:
    s = plan.schedule
    sched = schedule_named(s)
    if plan.vpp > 1:
        _check(not sched.one_chunk, "vpp", plan.vpp,
               f"schedule {s!r} runs one model chunk per stage (vpp = 1); "
               "use schedule 'interleaved' (or 'custom') for vpp > 1")
    elif sched.interleaved:
        _check(plan.pp == 1, "schedule", s,
               "interleaved 1F1B needs vpp > 1 model chunks per stage "
               "(--num-layers-per-virtual-pipeline-stage)")
    if sched.interleaved:
        _check(plan.num_microbatches % plan.pp == 0, "global_batch_size", plan.global_batch_size,
               f"interleaved 1F1B needs the number of micro-batches ({plan.num_microbatches}) "
               f"to be a multiple of pp = {plan.pp} (Megatron-LM's rule)")


def _check_uneven(plan) -> None:
    if plan.layer_split is not None:
        check_layer_split(plan)
    for attr, field, value in (("first_stage_layers", FIRST, plan.first_stage_layers),
                               ("last_stage_layers", LAST, plan.last_stage_layers)):
        if value is None:
            continue
        for cond, allowed in (  # in order, each only once the ones before it hold
                (lambda: isinstance(value, int) and not isinstance(value, bool) and value > 0,
                 "expected an integer > 0"),
                (lambda: plan.pp > 1, "an uneven first/last stage needs pp > 1"),
                (lambda: value % plan.vpp == 0,
                 f"must be a multiple of vpp = {plan.vpp} (each of the stage's chunks gets the same layers)"),
                (lambda: not (plan.account_for_embedding or plan.account_for_loss),
                 "cannot be combined with account_for_embedding / account_for_loss (Megatron-LM rejects the "
                 "combination too)")):
            require(cond(), f"plan: {field}", value, allowed, setting=attr)


def check_cluster(plan, pinned, topology, where: str) -> None:
    """The rules that need the resolved cluster: groups pinned inside an NVLink domain
    (``sim.inputs.pinning``)."""
    check_pinned(plan, pinned, topology.gpus_per_node, where)


def check_power_cap(profile, cap_w: float, flag: str = "--power-limit-w") -> None:
    """A power cap the GPU can run under (``sim.inputs.power.capped``): above its idle power
    and at most its board limit, which its profile must give."""
    if profile.power_limit_w is None or profile.idle_power_w is None:
        raise InputError(field=flag, value=cap_w, setting="power_limit_w", shown=f"{cap_w:g}",
                         allowed=f"profile {profile.name} gives no power_limit_w and idle_power_w (add them to its "
                                 "JSON to cap its power)")
    if not profile.idle_power_w < cap_w <= profile.power_limit_w:
        raise InputError(field=flag, value=cap_w, setting="power_limit_w", shown=f"{cap_w:g}",
                         allowed=f"watts above the idle power and at most the power limit of {profile.name}: "
                                 f"({profile.idle_power_w:g}, {profile.power_limit_w:g}]")


def check_nccl_algo(algo: str, topology) -> None:
    """A run-wide ``nccl_algo`` the topology can never run is an input error (NVLS
    without NVLink SHARP); one line naming the field, the value and what is allowed."""
    if algo in ("nvls", "nvls_tree") and not nvls_capable(topology, range(topology.num_gpus)):
        raise InputError(f"nccl_algo: got {algo!r}; topology {topology.name} has no NVLink SHARP (nvlink_sharp = "
                         "false on its NVSwitch; H100/H200/B200/GB200 NVSwitch only); allowed: auto, ring, tree, hierarchical")


# (experts.py)
def check_expert_plan(plan) -> None:
    """The expert-parallel fields with the others (``ParallelPlan.__post_init__``; each field's
    type and bounds are its declaration's, ``sim.inputs.plan._check_fields``)."""
    require(isinstance(plan.moe_routing, str) and plan.moe_routing, "plan: moe_routing", plan.moe_routing,
            "expected balanced, zipf:S, dirichlet:A or a histogram file")
    require(not plan.token_dispatcher.needs_ep or plan.ep > 1, "plan: moe_token_dispatcher_type", plan.dispatcher,
            f"needs expert parallelism (expert_model_parallel_size > 1, got {plan.ep}); with ep 1 the experts are "
            "local and only alltoall (no exchange) applies", setting="dispatcher")
    for field, value, default in (("moe_flex_dispatcher_backend", plan.moe_flex_dispatcher_backend, "deepep"),
                                  ("moe_flex_num_sms", plan.moe_flex_num_sms, None)):
        require(value == default or plan.token_dispatcher.backend, f"plan: {field}", value,
                f"needs moe_token_dispatcher_type flex (got {plan.dispatcher}): it sets the flex dispatcher's kernels",
                setting=field)
    folded = plan.ep * plan.etp_size
    require((plan.tp * plan.dp_cp) % folded == 0, "plan: expert_model_parallel_size", plan.ep,
            f"ep x etp = {plan.ep} x {plan.etp_size} must divide the tp x dp x cp = {plan.tp} x {plan.dp} x "
            f"{plan.cp} GPUs of each pipeline stage")
    sizes = sorted({1, plan.tp, plan.tp * plan.cp, plan.tp * plan.dp_cp, plan.etp_size, folded})
    require(all(b % a == 0 for a, b in zip(sizes, sizes[1:])), "plan: expert_tensor_parallel_size", plan.etp_size,
            f"tp {plan.tp}, tp x cp {plan.tp * plan.cp}, etp {plan.etp_size} and etp x ep {folded} must each "
            "divide the next larger of them")


def check_ep_overlap_plan(plan) -> None:
    """What Megatron-Core's ``TransformerConfig`` refuses with ``overlap_moe_expert_parallel_comm``
    (``sim.program.ep_overlap``), as far as the plan alone tells: expert parallelism, pipelining
    only when interleaved, no full recompute."""
    if not plan.overlap_moe_expert_parallel_comm:
        return
    where, value, field = "plan: overlap_moe_expert_parallel_comm", True, "overlap_moe_expert_parallel_comm"
    require(plan.ep > 1, where, value, f"needs expert parallelism (got ep {plan.ep}): it hides the "
            "expert-parallel all-to-alls", setting=field)
    require(plan.pp == 1 or plan.pipeline.interleaved, where, value,
            f"with pp {plan.pp} > 1 it needs the interleaved schedule (vpp > 1; got {plan.schedule}): Megatron-Core "
            "runs the combined 1F1B only without pipelining or with virtual pipeline stages", setting=field)
    require(plan.pp > 1 or plan.pipeline.pipedream_flush, where, value,
            f"with pp 1 it runs its own 1F1B order (got schedule {plan.schedule}); leave the schedule at 1f1b",
            setting=field)
    require(not plan.recompute_policy.whole_layer, where, value,
            "not with recompute_granularity full (Megatron-Core refuses it: a checkpointed layer cannot be "
            "interleaved with another micro-batch's)", setting=field)
    require(plan.token_dispatcher.overlappable, where, value,
            f"needs the alltoall or flex token dispatcher (got {plan.dispatcher}), as Megatron-Core does",
            setting=field)
    require("moe" not in (plan.recompute_modules or ()), where, value,
            "not with --recompute-modules moe (Megatron-Core refuses it: the recomputed MoE block's all-to-alls "
            "cannot be split across the interleaved micro-batches)", setting=field)


def check_shared_overlap(plan, model) -> None:
    """``moe_shared_expert_overlap``: Megatron-Core's rules (``TransformerConfig``): the
    alltoall or flex dispatcher, shared experts to overlap, and not with the shared experts
    recomputed."""
    if not plan.moe_shared_expert_overlap:
        return
    where, field = "plan: moe_shared_expert_overlap", "moe_shared_expert_overlap"
    require(bool(model.moe and model.moe_shared_expert_intermediate_size), where, True,
            f"{model.name} has no shared experts (moe_shared_expert_intermediate_size)", setting=field)
    require(plan.token_dispatcher.overlappable, where, True,
            f"needs the alltoall or flex token dispatcher (got {plan.dispatcher}), as Megatron-Core does",
            setting=field)
    require("shared_experts" not in (plan.recompute_modules or ()), where, True,
            "not with --recompute-modules shared_experts (Megatron-Core's rule)", setting=field)


def check_expert_model(plan, model) -> None:
    """Checks that need the model (``ParallelPlan.check_model``)."""
    check_shared_overlap(plan, model)
    if not model.moe:
        require(not plan.overlap_moe_expert_parallel_comm, "plan: overlap_moe_expert_parallel_comm", True,
                f"{model.name} has no experts (it hides the expert-parallel all-to-alls of an MoE model)",
                setting="overlap_moe_expert_parallel_comm")
        require(plan.ep == 1 and plan.etp is None, "plan: expert_model_parallel_size", plan.ep,
                f"{model.name} has no experts (expert parallelism needs --num-experts)")
        require(not plan.token_dispatcher.needs_ep, "plan: moe_token_dispatcher_type", plan.dispatcher,
                f"{model.name} has no experts (a token dispatcher needs --num-experts)", setting="dispatcher")
        return
    require(not plan.overlap_moe_expert_parallel_comm or model.mtp_num_layers <= 1,
            "plan: overlap_moe_expert_parallel_comm", True,
            f"supports at most one multi-token-prediction layer (Megatron-Core's rule; {model.name} has "
            f"{model.mtp_num_layers})", setting="overlap_moe_expert_parallel_comm")
    require(model.num_experts % plan.ep == 0, "plan: expert_model_parallel_size", plan.ep,
            f"must divide num_experts {model.num_experts} of {model.name}")
    etp = plan.etp_size
    for field in ("moe_ffn_hidden_size", "moe_shared_expert_intermediate_size"):
        width = getattr(model, field)
        if width is not None:
            require(width % (etp if field == "moe_ffn_hidden_size" else plan.tp) == 0,
                    "plan: expert_tensor_parallel_size" if field == "moe_ffn_hidden_size" else "plan: tp",
                    etp if field == "moe_ffn_hidden_size" else plan.tp, f"must divide {field} {width} of {model.name}")
    require(plan.tp == 1 or plan.sequence_parallel, "plan: sequence_parallel", False,
            "a mixture of experts with tp > 1 needs --sequence-parallel (Megatron-LM's rule)")
    if plan.zero.shards_params:
        check_sharded_experts(plan, model)


def check_sharded_experts(plan, model) -> None:
    """ZeRO-3 / FSDP with experts (FSDP2 with EP, as torchtitan and NeMo AutoModel run it):
    a rank's num_experts/ep experts are sharded over the edp ranks that hold the same ones,
    whole experts per rank when edp divides them (FSDP2's Shard(0) on the experts' dimension),
    else each expert's rows split evenly (torchtitan's Shard(1) when edp·ep > num_experts),
    which needs edp to be a multiple of the local experts and the rest of it to divide one
    expert's width on its etp rank."""
    local, edp = model.num_experts // plan.ep, plan.tp * plan.dp_cp // (plan.ep * plan.etp_size)
    if edp == 1 or local % edp == 0:
        return
    width = model.moe_ffn_hidden_size // plan.etp_size
    require(edp % local == 0 and width % (edp // local) == 0, "plan: expert_model_parallel_size", plan.ep,
            f"ZeRO-3 shards each rank's {local} experts (num_experts {model.num_experts} / ep {plan.ep}) over the "
            f"{edp} expert data-parallel ranks (tp x dp x cp / (ep x etp)): the experts must divide edp's shards "
            f"evenly (edp a divisor of the local experts, or a multiple of them whose quotient divides the expert "
            f"width {width} per etp rank)", setting="expert_model_parallel_size")


# (context_parallel.py)
def check_context_plan(plan) -> None:
    """The context-parallel fields with the others (``ParallelPlan.__post_init__``; each field's
    type and bounds are its declaration's)."""
    if plan.cp > 1:
        require(plan.attention_mode.fused, "plan: attention", plan.attention,
                "context parallelism needs flash attention (Megatron-LM runs it through Transformer Engine)")


def check_context_model(plan, model) -> None:
    """Checks of context parallelism that need the model."""
    if plan.cp == 1:
        return
    chunk = 2 * plan.cp  # Megatron's causal load balancing cuts each sequence in 2·cp chunks
    require(model.seq_length % chunk == 0, "plan: context_parallel_size", plan.cp,
            f"2 x cp = {chunk} must divide seq_length {model.seq_length} (causal load balancing cuts 2 x cp chunks)")
    local = plan.micro_batch_size * model.seq_length // plan.cp
    require(not plan.sp or local % plan.tp == 0, "plan: context_parallel_size", plan.cp,
            f"the {local} tokens of a micro-batch on one cp rank must split over tp = {plan.tp}")


# (frameworks.py)
def check_framework_plan(plan) -> None:
    """The plan's rules for these settings (``ParallelPlan.__post_init__``; their choices are
    their declarations')."""
    require(plan.attention_kernel is None or plan.attention_mode.fused, "plan: attention_kernel",
            plan.attention_kernel, "a fused kernel needs attention flash (unfused attention runs GEMMs and a "
            "softmax, no attention kernel)", setting="attention_kernel")
    for field, value, default in (("backward_prefetch", plan.backward_prefetch, None),
                                  ("reshard_after_forward", plan.reshard_after_forward, None),
                                  ("defer_fsdp_grad_sync", plan.defer_fsdp_grad_sync, None)):
        require(value == default or plan.zero.shards_params, f"plan: {field}", value,
                f"needs zero 3 (got {plan.zero_stage}): it says how FSDP / ZeRO-3 gathers the parameters or reduces "
                "the gradients", setting=field)
    require(plan.defer_fsdp_grad_sync is None or plan.sharding.fsdp2, "plan: defer_fsdp_grad_sync",
            plan.defer_fsdp_grad_sync, "FSDP2's set_requires_gradient_sync: needs a framework whose ZeRO-3 is "
            f"PyTorch FSDP2 (automodel, torchtitan; got {plan.framework or DEFAULT_FRAMEWORK})",
            setting="defer_fsdp_grad_sync")
    require(plan.defer_fsdp_grad_sync is not False or plan.pp < 2, "plan: defer_fsdp_grad_sync", False,
            f"under pipelining (pp {plan.pp}) torch's pipeline stage defers FSDP2's gradient sync to the stage's "
            "last backward of each schedule call (backward_maybe_with_nosync): leave it unset or on",
            setting="defer_fsdp_grad_sync")
    if plan.pp_call_microbatches is not None:
        require(plan.sharding.fsdp2 and plan.pp > 1,
                "plan: pp_call_microbatches", plan.pp_call_microbatches, "needs zero 3 under a framework whose ZeRO-3 "
                f"is PyTorch FSDP2 (automodel, torchtitan; got {plan.framework or DEFAULT_FRAMEWORK}, zero "
                f"{plan.zero_stage}) and pp > 1 (got {plan.pp})", setting="pp_call_microbatches")
        require(plan.num_microbatches % plan.pp_call_microbatches == 0, "plan: pp_call_microbatches",
                plan.pp_call_microbatches, f"a divisor of the step's {plan.num_microbatches} micro-batches per "
                "pipeline", setting="pp_call_microbatches")
    require(plan.grad_buckets is None or not (plan.sharding.deepspeed or plan.sharding.fsdp), "plan: grad_buckets",
            plan.grad_buckets, "says how DDP and Megatron-Core's distributed optimizer bucket the gradients: not under "
            f"{'DeepSpeed' if plan.sharding.deepspeed else 'FSDP'}, which buckets by its own rules (leave it unset)",
            setting="grad_buckets")
    check_deepspeed_plan(plan)

def check_deepspeed_plan(plan) -> None:
    """DeepSpeed's own settings only under it (their bounds are their declarations'); and under
    it none of the settings of the frameworks it is not (FSDP's, Megatron-LM's)."""
    if not plan.sharding.deepspeed:
        for field in DEEPSPEED_ONLY:
            require(getattr(plan, field) is None, f"plan: {field}", getattr(plan, field),
                    f"DeepSpeed's setting: needs framework deepspeed (got {plan.framework or DEFAULT_FRAMEWORK})",
                    setting=field)
        return
    for field, setting, value, ok, why in (
            ("backward_prefetch", "backward_prefetch", plan.backward_prefetch, plan.backward_prefetch is None,
             "FSDP1's; DeepSpeed prefetches along its trace (zero3_prefetch_bucket_size)"),
            ("reshard_after_forward", "reshard_after_forward", plan.reshard_after_forward,
             plan.reshard_after_forward is not False,
             "FSDP's; DeepSpeed keeps what is reused within zero3_max_reuse_distance"),
            ("zero3_prefetch_depth", "zero3_prefetch_depth", plan.zero3_prefetch_depth, plan.zero3_prefetch_depth == 1,
             "DeepSpeed prefetches by elements, not layers: give zero3_prefetch_bucket_size"),
            ("param_gather_overlap", "overlap_param_gather", plan.param_gather_overlap, not plan.param_gather_overlap,
             "Megatron-LM's; DeepSpeed all-gathers ZeRO-1/2's parameters after the step"),
            ("dp_overlap", "overlap_grad_reduce", plan.dp_overlap, plan.dp_overlap,
             "Megatron-LM's; DeepSpeed's is overlap_comm"),
            ("fp8_param_gather", "fp8_param_gather", plan.fp8_param_gather, not plan.fp8_param_gather,
             "Megatron-LM's (NeMo's fp8_params); DeepSpeed gathers 16-bit parameters"),
            ("pp", "pipeline_model_parallel_size", plan.pp, plan.pp == 1 or plan.zero_stage < 2,
             f"must be 1 under DeepSpeed with zero {plan.zero_stage} (its pipeline engine: \"ZeRO-2 and ZeRO-3 are "
             "incompatible with pipeline parallelism\")")):
        require(ok, f"plan: {field}", value, f"not a setting of framework deepspeed: {why}" if field != "pp" else why,
                setting=setting)


def check_deepspeed_model(plan, model: ModelSpec) -> None:
    """DeepSpeed's ZeRO-3 is modelled per tensor (``layer_tensors``) for standard layers only."""
    if not plan.sharding.deepspeed or not plan.zero.shards_params:
        return
    what = ("layer patterns" if model.layers is not None else "MLA" if model.mla
            else "experts" if model.num_experts is not None else None)
    require(what is None, "plan: framework", "deepspeed", f"with zero 3 not modelled for a model with {what} "
            f"({model.name}): its tensors are counted for standard transformer layers only", setting="framework")


# (recompute.py)
def check_recompute_plan(plan) -> tuple[str, ...] | None:
    """``recompute_method`` and ``recompute_modules`` against the granularity: modules only
    beside ``selective``, and not ``moe_act`` or ``layernorm`` under FP8 delayed scaling
    (their names checked by ``parse_recompute_modules``). Returns them in its order."""
    _check_method(plan)
    if plan.recompute_modules is None:
        return None
    mods = parse_recompute_modules(plan.recompute_modules)
    require(plan.recompute_policy.by_module, f"plan: {_RECOMPUTE_FIELD}", ",".join(mods),
            f"needs recompute_granularity selective (got {plan.recompute}): 'full' recomputes the whole layer, "
            "'none' nothing", setting=_RECOMPUTE_FIELD)
    fp8 = [m for m in ("layernorm", "moe_act") if m in mods]
    # Megatron-Core (core_v0.14.0 on, megatron/core/transformer/transformer_config.py): "Delayed scaling does
    # not support moe_act and layernorm recompute for fp8"; current scaling and block scales may
    require(plan.precision is None or not fp8 or not plan.precision.recipe.history, f"plan: {_RECOMPUTE_FIELD}",
            ",".join(fp8),
            "not with fp8_recipe delayed: FP8 delayed scaling cannot recompute moe_act or layernorm (Megatron-Core's "
            "rule; tensorwise, mxfp8 and blockwise can)", setting=_RECOMPUTE_FIELD)
    return mods


def check_recompute_model(plan, model) -> None:
    """Checks that need the model (``ParallelPlan.check_model``): each module is one the
    model has."""
    mods = plan.recompute_modules or ()
    name = getattr(model, "name", "the model")
    for m in mods:
        if m in EXPERT_MODULES:
            require(model.moe, f"plan: {_RECOMPUTE_FIELD}", m, f"{name} has no experts (a dense model: use mlp)", setting=_RECOMPUTE_FIELD)
        if m == "shared_experts":
            require(bool(model.moe_shared_expert_intermediate_size), f"plan: {_RECOMPUTE_FIELD}", m,
                    f"{name} has no shared experts", setting=_RECOMPUTE_FIELD)
        if m == "mla_up_proj":
            require(model.mla, f"plan: {_RECOMPUTE_FIELD}", m, f"{name} has no multi-latent attention (MLA)", setting=_RECOMPUTE_FIELD)
        if m == "mlp":
            require(model.num_moe_layers < model.num_layers, f"plan: {_RECOMPUTE_FIELD}", m,
                    f"every layer of {name} is an MoE layer (mlp recomputes dense MLPs only; use moe or moe_act)",
                    setting=_RECOMPUTE_FIELD)


def _check_method(plan) -> None:
    """``recompute_method`` and ``recompute_num_layers``: both or neither, and only under full."""
    method, n = plan.recompute_method, plan.recompute_num_layers
    if method is not None:
        require(plan.recompute_policy.whole_layer, "plan: recompute_method", method,
                f"needs recompute_granularity full (got {plan.recompute}): the method picks which layers fully "
                "recompute", setting="recompute_method")
        require(n is not None, "plan: recompute_num_layers", None,
                f"needs a number of layers (1 or more) with recompute_method {method} (Megatron-Core: between 1 and "
                "num_layers_per_pipeline_rank)", setting="recompute_num_layers")
    elif n is not None:
        require(False, "plan: recompute_num_layers", n,
                "needs recompute_method block or uniform and recompute_granularity full (Megatron-Core: under "
                "selective recompute_num_layers must be None)", setting="recompute_num_layers")


def check_recompute_layers(plan, model) -> None:
    """``recompute_num_layers`` against the model: at most the layers of one pipeline rank,
    and 1 under uniform when the model has multi-token-prediction layers."""
    n = plan.recompute_num_layers
    if n is None:
        return
    per_rank = model.num_layers // plan.pp
    require(n <= per_rank, "plan: recompute_num_layers", n,
            f"between 1 and num_layers_per_pipeline_rank: {per_rank} (Megatron-Core's range)",
            setting="recompute_num_layers")
    require(plan.recompute_method != "uniform" or n == 1 or not model.mtp_num_layers, "plan: recompute_num_layers", n,
            f"must be 1 under recompute_method uniform with multi-token prediction ({model.mtp_num_layers} MTP "
            "layers; Megatron-Core's MTP recompute)", setting="recompute_num_layers")


# (cuda_graphs.py)
def check_cuda_graph_plan(plan) -> None:
    """The rules that need the plan alone (``ParallelPlan.__post_init__``)."""
    scopes = plan.cuda_graph
    if not scopes:
        return
    where = f"plan: {_CUDA_GRAPH_FIELD}"
    require(not ("moe" in scopes and "moe_router" in scopes), where, "moe moe_router",
            "not both moe and moe_router (Megatron-Core's rule: moe already captures the router)", setting=_CUDA_GRAPH_FIELD)
    require("moe_preprocess" not in scopes or "moe_router" in scopes, where, "moe_preprocess",
            "needs moe_router as well (Megatron-Core graphs the preprocess only with the router)", setting=_CUDA_GRAPH_FIELD)
    require("full_iteration" not in scopes or len(scopes) == 1, where, " ".join(scopes),
            "full_iteration stands alone (it captures the whole iteration)", setting=_CUDA_GRAPH_FIELD)
    require(not plan.recompute_policy.whole_layer or scopes == ("full_iteration",), where, " ".join(scopes),
            "with recompute_granularity full only full_iteration (Megatron-Core's rule)", setting=_CUDA_GRAPH_FIELD)
    require(not ("moe_preprocess" in scopes and plan.token_dispatcher.exchanges_all_to_all
                 and plan.moe_capacity_factor is not None), where, "moe_preprocess",
            "not with the alltoall dispatcher and a capacity factor: its preprocess copies token counts to the host "
            "(Megatron-Core's rule)", setting=_CUDA_GRAPH_FIELD)


def check_cuda_graph_model(plan, model) -> None:
    """The rules that need the model (``ParallelPlan.check_model``)."""
    scopes = plan.cuda_graph
    if not scopes:
        return
    where = f"plan: {_CUDA_GRAPH_FIELD}"
    for s in ("moe", "moe_router", "moe_preprocess"):
        require(s not in scopes or model.moe, where, s, f"{model.name} has no experts (an MoE scope needs "
                "--num-experts)", setting=_CUDA_GRAPH_FIELD)
    if not model.moe:
        return
    dense = any(not model.is_moe_layer(i) for i in range(model.num_layers))
    require("mlp" not in scopes or dense, where, "mlp",
            f"{model.name} has no dense layer (every layer is MoE; mlp graphs a dense layer's MLP)", setting=_CUDA_GRAPH_FIELD)
    covering = [s for s in scopes if s in COVERS_MOE]
    require(not covering or plan.moe_capacity_factor is not None, where, covering[0] if covering else None,
            "captures the MoE block, which needs drop-padding MoE (moe_expert_capacity_factor set): dropless MoE "
            "copies its token counts to the host mid-block, which a graph cannot capture (Megatron-Core's rule)",
            setting=_CUDA_GRAPH_FIELD)
