"""search with mixtures of experts and long sequences: expert- and context-parallel sizes
are enumerated, and the pruning bound stays below the simulated time."""

from sim.inputs.hardware import load_profile
from sim.inputs.model import llama
from sim.inputs.topology_build import load_topology
from sim.studies.search import DEFAULT_MARGIN, SearchSpace, candidates, enumerate_plans
from sim.inputs.schema import SimulationSettings
from sim.session import Job, simulate_training

H100 = load_profile("h100-sxm")
MOE = llama("tiny-moe", 4, 512, 8, 8, 1024, 2000, 512, num_experts=8, moe_router_topk=2, moe_ffn_hidden_size=512)
LONG = llama("tiny-long", 4, 512, 8, 2, 1024, 2000, 32768)


def test_every_valid_expert_parallel_size_is_enumerated():
    plans = enumerate_plans(MOE, 8, 8, SearchSpace(tp=(1, 2), pp=(1,), zero_stage=(1,), recompute=("none",)))
    by_tp = {}
    for p in plans:
        by_tp.setdefault(p.tp, set()).add(p.ep)
        assert MOE.num_experts % p.ep == 0 and (p.tp * p.dp) % (p.ep * p.etp_size) == 0
        assert p.tp == 1 or p.sequence_parallel                      # Megatron's rule for MoE with tp
    assert by_tp[1] == {1, 2, 4, 8} and by_tp[2] == {1, 2, 4}       # ep x etp must fold into tp x dp = 8


def test_long_sequences_try_context_parallelism():
    plans = enumerate_plans(LONG, 8, 8, SearchSpace(tp=(1,), pp=(1,), zero_stage=(1,), recompute=("none",),
                                                    micro_batch_size=(1,)))
    assert {p.cp for p in plans} == {1, 2, 4, 8}
    assert all(p.dp * p.cp == 8 for p in plans)
    short = enumerate_plans(MOE, 8, 8, SearchSpace(tp=(1,), pp=(1,), zero_stage=(1,), recompute=("none",)))
    assert {p.cp for p in short} == {1}


def test_the_bound_never_exceeds_the_simulated_time_by_more_than_the_margin():
    topo = load_topology("dgx-h100")
    for model, space in ((MOE, SearchSpace(tp=(1,), pp=(1,), zero_stage=(1,), recompute=("none",),
                                           micro_batch_size=(1,))),
                         (LONG, SearchSpace(tp=(1,), pp=(1,), zero_stage=(1,), recompute=("none",),
                                            micro_batch_size=(1,), cp=(2, 4)))):
        for c in candidates(model, enumerate_plans(model, 8, 8, space), H100):
            simulated = simulate_training(Job(model, c.plan, H100, topo),
                                          SimulationSettings(fidelity="full")).trace.end_s
            assert c.bound_s / simulated <= DEFAULT_MARGIN, (c.key, c.bound_s, simulated)
