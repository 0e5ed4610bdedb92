"""A custom hybrid model from Megatron-Core's layer pattern (``--hybrid-override-pattern``,
``sim.inputs.megatron_model``): its letters make the layers, its ``|`` the pipeline layout."""

import pytest

from sim.inputs.layers import DenseMLP, FullAttention, Layer, Mamba2, MoE
from sim.inputs.resolve import model_from_settings, plan_from_settings
from sim.inputs.schema import RunSettings

SHAPE = {"num_layers": 8, "hidden_size": 1024, "num_attention_heads": 8, "vocab_size": 32000, "seq_length": 4096}


def settings(model: dict, plan: dict | None = None) -> RunSettings:
    return RunSettings.from_values({**SHAPE, **model, "gpu": "h100-sxm", "gpus": 8, "global_batch_size": 16,
                                    **(plan or {})})


def test_letters_make_the_layers_with_megatron_defaults():
    m = model_from_settings(settings({"hybrid_override_pattern": "M-M*M-ME", "num_experts": 4}).model)
    # Megatron-LM arguments.py: --mamba-state-dim 128, --mamba-head-dim 64, --mamba-num-groups 8;
    # MambaMixer: expand 2 (d_inner 2 x 1024 = 2048, so 2048 / 64 = 32 heads), d_conv 4, chunk_size 128
    mamba = Layer(Mamba2(heads=32, head_dim=64, state=128, groups=8, conv=4, chunk=128), None)
    mlp, attn, moe = Layer(None, DenseMLP()), Layer(FullAttention(), None), Layer(None, MoE())
    assert m.layers == (mamba, mlp, mamba, attn, mamba, mlp, mamba, moe)
    assert [m.is_moe_layer(i) for i in range(8)] == [False] * 7 + [True]


def test_mamba_flags_set_the_mamba_layers():
    m = model_from_settings(settings({"hybrid_override_pattern": "MMMM*---", "mamba_state_dim": 64,
                                      "mamba_head_dim": 128, "mamba_num_groups": 2, "mamba_num_heads": 12}).model)
    assert m.layers[0].mixer == Mamba2(heads=12, head_dim=128, state=64, groups=2, conv=4, chunk=128)
    assert m.layers.count(m.layers[0]) == 4


def test_no_pattern_no_layers():
    assert model_from_settings(settings({}).model).layers is None


@pytest.mark.parametrize("pattern,pp,per_stage", [
    ("M-M*M-|M*", 2, (6, 2)),            # pp 2: one segment per rank
    ("M-M|*M-|M|*", 2, (3, 3, 1, 1)),    # four segments on pp 2: vpp 2, in virtual-stage order (chunk x pp + rank)
    ("|M-M*M-M*", 2, (0, 8)),            # an empty first segment: the embedding alone
])
def test_pipes_place_the_layers_on_the_virtual_stages(pattern, pp, per_stage):
    s = settings({"hybrid_override_pattern": pattern}, {"pipeline_model_parallel_size": pp})
    model = model_from_settings(s.model)
    plan = plan_from_settings(s.plan, 8, model)
    assert plan.vpp == len(per_stage) // pp
    assert plan.stage_layers(model) == per_stage


def test_the_pattern_travels_with_the_model():
    # The plan takes the | from the model itself: no caller passes the pattern along.
    s = settings({"hybrid_override_pattern": "M-M*M-|M*"}, {"pipeline_model_parallel_size": 2})
    model = model_from_settings(s.model)
    assert model.hybrid_override_pattern == "M-M*M-|M*"
    assert plan_from_settings(s.plan, 8, model).pipeline_layout == "E" + "t" * 6 + "|ttL"  # 6 layers, then 2


def test_an_experiment_files_model_table_takes_the_pattern(tmp_path):
    from sim.inputs.experiment import read_experiment, values_of

    path = tmp_path / "hybrid.toml"
    path.write_text('[model]\nnum_layers = 8\nhidden_size = 1024\nnum_attention_heads = 8\nvocab_size = 32000\n'
                    'seq_length = 4096\nhybrid_override_pattern = "M-M*M-|M*"\nmamba_state_dim = 64\n\n'
                    '[cluster]\ngpu = "h100-sxm"\ngpus = 8\n\n[plan]\npipeline_model_parallel_size = 2\n'
                    'global_batch_size = 16\n')
    s = RunSettings.from_values(values_of(read_experiment(path).settings))
    model = model_from_settings(s.model)
    assert model.layers[0].mixer.state == 64 and model.layers.count(model.layers[3]) == 2  # the two attention layers
    assert plan_from_settings(s.plan, 8, model).stage_layers(model) == (6, 2)
