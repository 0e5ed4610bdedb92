"""The CLI's contract: unknown flags are one-line errors with exit code 2."""

from sim.cli import main


def test_unknown_flag_is_one_line_exit_2(capsys):
    assert main(["collective", "--no-such-flag"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--no-such-flag" in err[0]


def test_run_accepts_every_model_source_gpu_and_fabric(tmp_path, capsys):
    # A user's usual ways in: Megatron flags, a Hugging Face config.json, a preset, a GPU
    # profile .json; H200 nodes; a fat-tree fabric; sequence parallelism and recompute.
    import json

    from sim.inputs.hardware import load_profile

    def run(*argv, status=0):  # 0: the plan fits; 1: it does not (issue 54)
        assert main(["run", *argv, "--json"]) == status, capsys.readouterr().err
        return json.loads(capsys.readouterr().out)

    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"hidden_size": 512, "intermediate_size": 1408, "num_hidden_layers": 4,
                               "num_attention_heads": 8, "num_key_value_heads": 4, "vocab_size": 4096,
                               "max_position_embeddings": 512, "tie_word_embeddings": False}))
    hf = run("--hf-config", str(cfg), "--gpu", "h200", "--nodes", "2", "--tensor-model-parallel-size", "4",
             "--pipeline-model-parallel-size", "2", "--fabric", "fat-tree", "--sequence-parallel",
             "--recompute-granularity", "selective", "--micro-batch-size", "2", "--global-batch-size", "8")
    assert hf["gpu"] == "h200" and hf["gpus"] == 16 and "fat-tree" in hf["topology"]
    assert hf["plan"]["dp"] == 2 and hf["plan"]["sequence_parallel"] and hf["plan"]["recompute"] == "selective"
    assert hf["hfu"] > hf["mfu"] > 0  # selective recompute re-runs the attention core
    # a profile file equal to the preset gives the same iteration; half the memory, the verdict follows it
    flags = ["--num-layers", "4", "--hidden-size", "512", "--num-attention-heads", "8", "--vocab-size", "4096",
             "--seq-length", "512", "--gpus", "8", "--global-batch-size", "8", "--topology", "dgx-h100"]
    prof = load_profile("h100-sxm")
    prof.save(tmp_path / "mine.json")
    a = run(*flags, "--gpu", "h100-sxm")
    b = run(*flags, "--gpu", str(tmp_path / "mine.json"))
    assert a["iteration_time_s"] == b["iteration_time_s"] and a["fits"]
    d = prof.to_dict()
    d["name"], d["hbm_capacity_bytes"] = "tiny-hbm", a["memory"]["peak_bytes"] / 2
    (tmp_path / "tiny.json").write_text(json.dumps(d))
    c = run(*flags, "--gpu", str(tmp_path / "tiny.json"), status=1)
    assert c["fits"] is False and c["memory_capacity_bytes"] == a["memory"]["peak_bytes"] / 2


def test_run_and_estimate_write_the_micro_batches_as_the_demo_does(capsys):
    # issue 44: run printed "micro-batch 1 x 16" for 16 micro-batches of 1, the demo
    # "16 micro-batches of 1 x 4096 tokens"; one notation everywhere (the demo's)
    flags = ["--num-layers", "4", "--hidden-size", "512", "--num-attention-heads", "8", "--vocab-size", "4096",
             "--seq-length", "256", "--gpu", "h100-sxm", "--gpus", "2", "--global-batch-size", "12",
             "--micro-batch-size", "2"]
    for command in ("run", "estimate"):
        assert main([command, *flags]) == 0
        out = capsys.readouterr().out
        assert "3 micro-batches of 2 x 256 tokens" in out, (command, out)
        assert "micro-batch 2 x" not in out and "micro-batch 2," not in out
    assert main(["run", *flags[:-4], "--global-batch-size", "2", "--micro-batch-size", "1"]) == 0
    assert "1 micro-batch of 1 x 256 tokens" in capsys.readouterr().out
