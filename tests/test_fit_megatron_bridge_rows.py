"""The Megatron-Bridge rows of the fit data (experiments/fit-data/megatron_bridge_runs.csv): every run of
../shared/fit-data/megatron-bridge-25.09-25.11.md, one group per model, system and release, each step time
the published throughput turned into seconds. The expectations are read from the markdown tables here,
independently of the CSV."""

import csv
import re
from pathlib import Path

import pytest

from sim.calibrate.runs_csv import read_runs

ROOT = Path(__file__).resolve().parent.parent
CSV = ROOT / "experiments/fit-data/megatron_bridge_runs.csv"
MD = ROOT.parent / "shared/fit-data/megatron-bridge-25.09-25.11.md"
RUNS = read_runs(CSV)
CELLS = list(csv.DictReader(CSV.open()))
MODELS = {"LLAMA3_8B": "Llama 3 8B", "LLAMA3_70B": "Llama 3 70B", "LLAMA3.1_405B": "Llama 3.1 405B",
          "DeepSeekV3": "DeepSeek-V3", "GPT OSS 120B": "GPT-OSS 120B", "Qwen3_30B_a3B": "Qwen3-30B-A3B",
          "Qwen3_235B_a22B": "Qwen3-235B-A22B"}


def _published() -> dict:
    """{group text: sorted step times} from the markdown's tables: one entry per tokens/s figure
    (the parenthesised one is the other quantization's run), step = GBS x seq / (tokens/s/GPU x GPUs)."""
    out, release, system, header = {}, None, None, None
    for line in MD.read_text().splitlines():
        if m := re.match(r"### (25\.\d\d)", line):
            release = m.group(1)
        elif m := re.match(r"\*\*System: (DGX-\w+)\*\*", line):
            system = m.group(1)
        elif line.startswith("| Model"):
            header = [c.strip() for c in line.strip("|").split("|")]
        elif line.startswith("|") and not line.startswith("|--") and header:
            cells = dict(zip(header, (c.strip() for c in line.strip("|").split("|"))))
            model = next(v for k, v in MODELS.items() if cells["Model"].startswith(k))
            gpus, gbs, seq = (int(cells[k]) for k in ("#-GPUs", "GBS", "Sequence Length"))
            for tokens in re.findall(r"\d+", cells["Tokens / sec / GPU"]):
                out.setdefault(f"{release} {system} {model}", []).append(gbs * seq / (int(tokens) * gpus))
    return {g: sorted(v) for g, v in out.items()}


PUBLISHED = _published() if MD.exists() else {}
needs_md = pytest.mark.skipif(not MD.exists(), reason=f"{MD} (the shared fit data beside the checkout) is absent")


@needs_md
def test_the_markdown_has_the_tables_this_file_encodes():
    # 25.11: 8 + 8 + 6 + 6 table lines, 25.09: 6 + 5 + 6 (the md's own tables)
    # 25.11 GB300 and GB200 print DeepSeek-V3 on two lines each (BF16, FP8-MX): one group each
    assert len(PUBLISHED) == 8 + 8 + 6 + 6 + 6 + 5 + 6 - 2


@needs_md
def test_one_group_per_model_system_and_release_with_every_published_figure():
    mine = {}
    for r in RUNS:
        mine.setdefault(r.group[1], []).append(r.measured_s)
    assert sorted(mine) == sorted(PUBLISHED)
    for g, steps in PUBLISHED.items():
        assert sorted(mine[g]) == pytest.approx(steps, rel=1e-4), g
    assert len({r.group for r in RUNS}) == len(PUBLISHED)  # one source per release and system: no group split


@pytest.mark.parametrize("group, gbs, seq, tokens, gpus, step_s", [
    # 4096 x 4096 = 16,777,216 tokens; 3848 x 256 = 985,088 tokens/s: 17.0313 s
    ("25.11 DGX-GB300 DeepSeek-V3", 4096, 4096, 3848, 256, 17.0313),
    # 128 x 8192 = 1,048,576 tokens; 1619 x 64 = 103,616 tokens/s: 10.1198 s
    ("25.09 DGX-H100 Llama 3 70B", 128, 8192, 1619, 64, 10.1198),
])
def test_step_time_by_hand(group, gbs, seq, tokens, gpus, step_s):
    r = next(r for r in RUNS if r.group[1] == group and r.values.get("fp8_recipe") != "mxfp8")
    v = r.values
    assert (v["global_batch_size"], v["seq_length"], v["gpus"]) == (gbs, seq, gpus)
    assert r.measured_s == pytest.approx(step_s, rel=1e-4)


def test_rows_per_gpu():
    # the md's figures per system: GB300 8 lines + 1 parenthesised; GB200 8 + 1 (25.11) and 6 + 6 (25.09);
    # B200 6 + 2 and 5 + 4; H100 6 and 6
    count = {}
    for r in RUNS:
        count[r.gpu] = count.get(r.gpu, 0) + 1
    assert count == {"gb300": 9, "gb200": 21, "b200": 17, "h100-sxm": 12}


def test_what_each_row_needs():
    for r, cells in zip(RUNS, CELLS):
        # the recipes' CUDA graphs are the cuda_graph setting (Megatron-Core's scope names), simulated
        assert r.values.get("cuda_graph") == (cells["cuda_graph"] or None), r.line
        assert "cuda_graph" not in r.missing
        # GPT-OSS runs on its preset (its layer kinds exist); its learned sinks run in cuDNN's fused
        # attention in the 25.11 container (TE 2.9, cuDNN 9.13.1), the flash kernel trainsim prices
        oss = cells["group"].endswith("GPT-OSS 120B")
        assert (cells["model"] == "gpt-oss-120b") == oss, r.line
        assert "attention_sinks" not in r.missing and "gpt_oss" not in r.missing, r.line
        assert not oss or "cuDNN 9.13.1.26" in cells["notes"], r.line
        # a row whose figure disagrees with the same layout in the other release is left out, said so
        suspect = "consistent_data" in cells["needs"]
        assert (r.skip is None) == (not r.missing and not suspect)
        assert not suspect or "disagrees with the same layout" in r.skip
        assert "settings read from Megatron-Bridge" in cells["notes"]
    for r in RUNS:  # Megatron-FSDP with FP8 weights: the recipe gathers them in FP8, simulated under zero 3
        fp8_fsdp = r.values.get("zero") == 3 and r.precision == "fp8"
        assert "zero3_fp8_param_gather" not in r.missing
        assert not fp8_fsdp or r.values["fp8_param_gather"]
    graphs = {c["group"].split(" ", 1)[0]: set() for c in CELLS}
    for c in CELLS:
        graphs[c["group"].split(" ", 1)[0]].add(c["cuda_graph"])
    # 25.11's workload configs: local full_iteration (Llama 3 8B) or TE scopes (MoE); 25.09's enable_cuda_graph
    assert graphs["25.11"] == {"", "full_iteration", "moe_router,moe_preprocess", "attn,moe_router,moe_preprocess"}
    assert graphs["25.09"] == {"", "full"}
    suspect = sorted(c["group"] for c in CELLS if "consistent_data" in c["needs"])
    # 25.11 and 25.09 on the same 8-B200 and 16-H100 layouts: 9,299 vs 18,066 and 5,275 vs 10,494 tokens/s/GPU
    assert suspect == ["25.11 DGX-B200 Qwen3-30B-A3B", "25.11 DGX-H100 Qwen3-30B-A3B"]
    # the GB recipes' activation offload (cpu_offloading_num_layers) is simulated: the recipes' layer counts
    # (Megatron-Bridge r0.2.0 workload_base_configs.py, fa0315ae2684 perf_matrix)
    assert not any("activation_offload" in r.missing for r in RUNS)
    offload = {c["group"]: r.values["cpu_offloading_num_layers"] for r, c in zip(RUNS, CELLS)
               if r.values.get("cpu_offloading_num_layers")}
    assert offload == {"25.09 DGX-GB200 Llama 3 70B": 40, "25.09 DGX-GB200 Llama 3.1 405B": 95,
                       "25.11 DGX-GB200 Llama 3 70B": 40, "25.11 DGX-GB300 Llama 3 70B": 20}
    for c in CELLS:
        assert bool(c["cpu_offloading_num_layers"]) == (f"cpu_offloading_num_layers {c['cpu_offloading_num_layers']} "
                                                        in c["notes"]), c["group"]


def test_precisions_and_fp8_recipes():
    for r in RUNS:
        v = r.values
        if r.precision == "bf16":
            assert "fp8_format" not in v
        else:
            assert (v["fp8_format"], v["fp8_recipe"]) in (("hybrid", "tensorwise"), ("e4m3", "mxfp8"))
            # every FP8 precision recipe keeps the weights in FP8 (MXFP8 ones too, and under Megatron-FSDP)
            assert v["fp8_param_gather"] is True
    mx = [r for r in RUNS if r.values.get("fp8_recipe") == "mxfp8"]
    assert all(r.gpu != "h100-sxm" for r in mx)  # MXFP8 is Blackwell's
    assert all("mxfp8_param_gather" not in r.missing for r in mx)  # MXFP8 weights gathered in BF16: simulated


def test_recipe_settings_reach_the_rows():
    by = {(r.group[1], r.values.get("fp8_recipe")): r.values for r in RUNS}
    ds = by[("25.11 DGX-GB200 DeepSeek-V3", None)]
    assert (ds["moe_token_dispatcher_type"], ds["recompute_modules"], ds["mtp_num_layers"]) == (
        "flex", "mla_up_proj", 0)
    assert (ds["moe_permute_fusion"], ds["moe_shared_expert_overlap"]) == (True, False)  # flex turns it off
    h100 = by[("25.09 DGX-H100 DeepSeek-V3", "tensorwise")]
    assert h100["overlap_moe_expert_parallel_comm"] is True and h100["overlap_grad_reduce"] is False
    assert h100["moe_shared_expert_overlap"] is False                                   # A2A_1F1B turns it off
    assert by[("25.11 DGX-B200 DeepSeek-V3", "mxfp8")]["moe_shared_expert_overlap"] is True  # the provider default
    fsdp = by[("25.09 DGX-H100 Llama 3 8B", "tensorwise")]
    assert fsdp["zero"] == 3                      # Megatron-FSDP
    assert "recompute_method" not in fsdp and fsdp["recompute_granularity"] == "none"  # 25.09: no recompute
    # 25.11's H100 FP8-CS config: recompute_num_layers 5, which set_recompute_overrides runs as full, block
    rec = by[("25.11 DGX-H100 Llama 3 8B", "tensorwise")]
    assert (rec["recompute_granularity"], rec["recompute_method"], rec["recompute_num_layers"]) == ("full", "block", 5)
    blocks = [r.group[1] for r in RUNS if r.values.get("recompute_method")]
    assert blocks == ["25.11 DGX-H100 Llama 3 8B"]  # the only row whose recipe notes record it
    assert not any("recompute_num_layers" in r.missing for r in RUNS)  # simulated now
    ddp = by[("25.09 DGX-H100 Llama 3 70B", "tensorwise")]
    assert (ddp["zero"], ddp["overlap_param_gather"]) == (1, True)  # distributed optimizer (BY_SOURCE)
    assert ddp["tp_comm_overlap_cfg"] == "userbuffers_fp8_h100_h8192_tp4_mbs1_seqlen8192"
    for r in RUNS:  # Megatron-Core's rank order; 64 GPUs per NVL72 rack (the executors' --segment 16)
        assert r.values["placement"] == "tp-dp-pp"
        assert r.values.get("gpus_per_node") == (64 if r.gpu in ("gb200", "gb300") else None)
    # GPT-OSS 120B: every Blackwell recipe replaces the base config's EP 8 with 64 (and MBS 4); the B200
    # table prints 8, but the recipe with its MBS 4 has 64 (GPT_OSS_120B_B200_BF16_BASE_CONFIG, r0.2.0)
    oss = {r.gpu: r.values for r in RUNS if r.values.get("model") == "gpt-oss-120b"}
    assert {g: v["expert_model_parallel_size"] for g, v in oss.items()} == {
        "gb300": 64, "gb200": 64, "b200": 64, "h100-sxm": 8}
    assert oss["b200"]["micro_batch_size"] == 4 and oss["h100-sxm"]["pipeline_model_parallel_size"] == 4
    for r in RUNS:  # force-balanced routing in every MoE row
        if "expert_model_parallel_size" in r.values:
            assert r.values["moe_routing"] == "balanced"


def _write(tmp_path, rows):
    head = "source,group,gpu,precision,gpus,model,seq_length,micro_batch_size,global_batch_size," \
           "measured_iteration_time_s,needs"
    p = tmp_path / "runs.csv"
    p.write_text(head + "\n" + "\n".join(rows) + "\n")
    return read_runs(p)


def test_group_column_joins_precisions_and_blank_keeps_the_old_groups(tmp_path):
    runs = _write(tmp_path, ["S,one,h100-sxm,bf16,8,llama3-8b,8192,1,128,5.0,",
                             "S,one,h100-sxm,fp8,8,llama3-8b,8192,1,128,4.0,",
                             "S,,h100-sxm,bf16,8,llama3-8b,8192,1,128,5.0,",
                             "S,,h100-sxm,fp8,8,llama3-8b,8192,1,128,4.0,"])
    assert runs[0].group == runs[1].group and runs[2].group != runs[3].group
    assert [r.precision for r in runs] == ["bf16", "fp8", "bf16", "fp8"]


def test_needs_lists_several_capabilities_and_skips_on_any_missing(tmp_path):
    runs = _write(tmp_path, ['S,,h100-sxm,fp8,8,llama3-8b,8192,1,128,4.0,"fp8, context_parallel"',
                             'S,,h100-sxm,fp8,8,llama3-8b,8192,1,128,4.0,"fp8, cuda_graph, gpt_oss"'])
    assert runs[0].skip is None and runs[0].missing == ()
    assert runs[1].missing == ("cuda_graph", "gpt_oss")
    assert runs[1].skip == "needs cuda_graph, gpt_oss (not simulated yet)"


@pytest.mark.parametrize("gpu", ["gb200", "gb300"])
def test_fit_fits_a_grace_blackwell_profile_on_its_own_rows(gpu, tmp_path):
    """``trainsim fit --gpu gb200|gb300`` fits that preset to its own rows (not B200's): rows timed on a
    copy of the preset with a known fraction give the fraction back, and the other GPUs' rows are left out."""
    import json
    from dataclasses import replace as dc_replace

    import sim
    from sim.cli import main
    from sim.inputs.hardware import load_profile

    truth = tmp_path / "truth.json"
    dc_replace(load_profile(gpu), sustained_compute_fraction=0.7).save(truth)
    # large enough that the GEMMs, not launches and latencies, set the step (a few 100 ms)
    shapes = {"a": dict(num_layers=4, hidden_size=8192, num_attention_heads=64, vocab_size=32000, seq_length=4096,
                        tensor_model_parallel_size=2),
              "b": dict(num_layers=4, hidden_size=6144, num_attention_heads=48, vocab_size=32000, seq_length=8192,
                        tensor_model_parallel_size=1)}
    head = ["source", "gpu", "gpus", "gpus_per_node", "num_layers", "hidden_size", "num_attention_heads", "vocab_size",
            "seq_length", "tensor_model_parallel_size", "global_batch_size", "measured_iteration_time_s"]
    rows = []
    for name, m in shapes.items():
        r = sim.run(**m, gpus=8, gpus_per_node=64, global_batch_size=16, gpu=str(truth), fidelity="reduced")
        rows.append({"source": f"test {name}", "gpu": gpu, "gpus": 8, "gpus_per_node": 64, **m,
                     "global_batch_size": 16, "measured_iteration_time_s": repr(r.iteration_time_s)})
    rows.append(dict(rows[0], gpu="b200"))
    data = tmp_path / "runs.csv"
    with data.open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=head)
        w.writeheader()
        w.writerows(rows)
    out = tmp_path / "fitted.json"
    import contextlib
    import io
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert main(["fit", str(data), "--gpu", gpu, "--params", "sustained_compute_fraction", "--json",
                     "--out", str(out)]) == 0
    report = json.loads(buf.getvalue())
    assert report["gpu"] == gpu and report["left_out"] == [{"line": 4, "gpu": "b200"}]
    assert report["parameters"][0]["initial"] == load_profile(gpu).sustained_compute_fraction
    assert report["parameters"][0]["fitted"] == pytest.approx(0.7, rel=0.01)
    fitted = load_profile(out)
    assert fitted.name == gpu and fitted.sustained_compute_fraction == report["parameters"][0]["fitted"]
