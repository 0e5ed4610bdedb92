"""The same input gives the same output in every process, whatever Python's hash seed.

String hashes are salted per process (PYTHONHASHSEED), so anything that iterates a set or
orders by ``hash()`` can change the order of events between two runs of one input. In one
process that never shows: the suite's in-process determinism checks (test_training.py) run
twice under the same salt. Here two processes with different salts run one plan that goes
through most of the engine (tensor-, pipeline-, data- and expert-parallel groups across two
nodes, interleaved 1F1B, ZeRO-1, Transformer Engine's TP overlap, NCCL's algorithms as
steps) and must write the same summary and trace, byte for byte.
"""

import os
import subprocess
import sys

ARGS = ["run", "--num-layers", "4", "--hidden-size", "512", "--num-attention-heads", "8", "--vocab-size", "32000",
        "--seq-length", "512", "--num-experts", "4", "--moe-router-topk", "2", "--expert-model-parallel-size", "2",
        "--gpu", "h100-sxm", "--gpus", "16", "--gpus-per-node", "8", "--tensor-model-parallel-size", "2",
        "--pipeline-model-parallel-size", "2", "--num-virtual-stages-per-pipeline-rank", "2", "--sequence-parallel",
        "--tp-comm-overlap", "--global-batch-size", "16", "--zero", "1", "--collective-model", "steps",
        "--fidelity", "full"]


def test_two_processes_with_different_hash_seeds_write_the_same_trace(tmp_path):
    outs = []
    for seed in ("0", "1"):
        out = tmp_path / f"seed{seed}"
        env = {**os.environ, "PYTHONHASHSEED": seed}
        done = subprocess.run([sys.executable, "-m", "sim", *ARGS, "--out", str(out)], env=env,
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr
        outs.append(out)
    for name in ("summary.json", "trace.json"):
        assert (outs[0] / name).read_bytes() == (outs[1] / name).read_bytes(), name
