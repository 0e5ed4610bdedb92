"""Regenerate the importer fixtures in this folder (run from the repository root).

    .venv/bin/python tests/data/make_fixtures.py

- ``nccl_all_reduce_8gpu.txt`` / ``.json``: nccl-tests output (text layout of
  ``all_reduce_perf -b 8 -e 1G -f 4 -g 8``, and its JSON form) written from a known
  α-β model (α = 2.5 µs per ring step, B = 370 GB/s, 8 ranks), rounded as nccl-tests
  prints, so a test can check that the fit finds the model again. Hand-made variants of
  it: ``nccl_no_footer.txt`` (run cut after the last row), ``nccl_inplace_only.txt``
  (out-of-place columns blank), ``nccl_truncated.txt`` (file cut inside a row),
  ``nccl_old_all_gather.txt`` (an older layout: no redop/root columns, ``error``),
  ``rccl_all_reduce.jsonl`` (rccl-tests' one-object-per-line JSON).
- ``gloo_all_reduce_perf.txt``: a real all-reduce sweep between 2 gloo processes on
  this machine (``sim.calibrate.collectives``), written in nccl-tests' layout.
- ``kineto_rank0.json.gz`` / ``kineto_rank1.json.gz``: PyTorch profiler traces of one 1F1B
  iteration of a tiny GPT on 2 gloo processes (``sim.calibrate.reference``).
"""

import gzip
import json
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ALPHA, B, N = 2.5e-6, 370e9, 8


def _f(value: float, width: int) -> str:
    """nccl-tests' getFloatStr: 2 decimals while they fit the width."""
    digits = len(str(int(value))) if value >= 1 else 1
    if digits < width - 2:
        return f"{value:{width}.2f}"
    if digits < width - 1:
        return f"{value:{width}.1f}"
    return f"{value:{width}.0f}"


def nccl_rows():
    rows = []
    for p in range(3, 31, 2):
        size = 2**p
        t = 2 * (N - 1) * ALPHA + 2 * (N - 1) / N * size / B
        alg = size / t / 1e9
        rows.append((size, size // 4, t * 1e6, alg, alg * 2 * (N - 1) / N))
    return rows


def nccl_text(footer=True, inplace_only=False, cut=False):
    head = ["# nccl-tests version 2.17.1 nccl-headers=22703 nccl-library=22703",
            "# Collective test starting: all_reduce_perf",
            "# nThread 1 nGpus 8 minBytes 8 maxBytes 1073741824 step: 4(factor) warmup iters: 5 iters: 20 "
            "agg iters: 1 validation: 1 graph: 0 unalign: 0", "#", "# Using devices"]
    head += [f"#  Rank {r:2d} Group  0 Pid  41{r:03d} on   dgx-h100 device {r:2d} [0000:{r:02x}:00] NVIDIA H100 80GB HBM3"
             for r in range(N)]
    head += ["#", "#                                                              out-of-place                       in-place",
             "#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong",
             "#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)"]
    body = []
    for size, count, t, alg, bus in nccl_rows():
        lead = f"{size:12d}  {count:12d}  {'float':>8}  {'sum':>6}  {-1:6d}"
        oop = f"  {_f(t, 7)}  {_f(alg, 6)}  {_f(bus, 6)}  {0:6g}"
        ip = f"  {_f(t * 1.01, 7)}  {_f(alg / 1.01, 6)}  {_f(bus / 1.01, 6)}  {'N/A':>6}"
        body.append(lead + (" " * len(oop) if inplace_only else oop) + ip)
    if cut:
        body[-1] = body[-1][:60]
    avg = sum(r[4] for r in nccl_rows()) / len(nccl_rows())
    tail = ["# Out of bounds values : 0 OK", f"# Avg bus bandwidth    : {avg:g} ", "#",
            "# Collective test concluded: all_reduce_perf", "#"]
    return "\n".join(head + body + (tail if footer else [])) + "\n"


def nccl_json():
    results = [{"size": s, "count": c, "type": "float", "redop": "sum", "root": "    -1",
                "out_of_place": {"time": t, "alg_bw": a, "bus_bw": b, "nwrong": 0.0},
                "in_place": {"time": t * 1.01, "alg_bw": a / 1.01, "bus_bw": b / 1.01, "nwrong": None},
                "actual_iterations": 20, "experiment_name": ""} for s, c, t, a, b in nccl_rows()]
    return {"version": 2, "start_time": "2026-01-01 00:00:00", "args": ["./build/all_reduce_perf", "-b", "8", "-e",
            "1G", "-f", "4", "-g", "8", "-J", "out.json"], "env": [], "nccl_version": 22703,
            "config": {"nthreads": 1, "ngpus": 8, "minimum_bytes": 8, "maximum_bytes": 2**30, "step_factor": 4,
                       "devices": [{"rank": 0, "group": 0, "pid": 41000, "hostname": "dgx-h100", "device": 0,
                                    "device_hex": "0000:00:00", "device_info": "NVIDIA H100 80GB HBM3"}]},
            "results": results, "out_of_bounds": {"count": 0, "okay": "true"},
            "average_bus_bandwidth": {"bandwidth": 100.0, "okay": "unchecked"}, "errors": [],
            "end_time": "2026-01-01 00:00:05"}


OLD_ALL_GATHER = """# nThread 1 nGpus 4 minBytes 1048576 maxBytes 67108864 step: 4(factor) warmup iters: 5 iters: 20 validation: 1
#
# Using devices
#   Rank  0 Pid  12001 on     node-a device  0 [0x07] Tesla V100-SXM2-32GB
#   Rank  1 Pid  12001 on     node-a device  1 [0x0a] Tesla V100-SXM2-32GB
#   Rank  2 Pid  12001 on     node-a device  2 [0x0b] Tesla V100-SXM2-32GB
#   Rank  3 Pid  12001 on     node-a device  3 [0x85] Tesla V100-SXM2-32GB
#
#                                             out-of-place                       in-place
#       size         count    type     time   algbw   busbw  error     time   algbw   busbw  error
#        (B)    (elements)             (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)
     1048576         65536   float    28.41   36.91   27.68  0e+00    27.95   37.52   28.14  0e+00
     4194304        262144   float    82.10   51.09   38.32  0e+00    81.77   51.29   38.47  0e+00
    16777216       1048576   float    290.5   57.75   43.32  0e+00    289.9   57.87   43.41  0e+00
    67108864       4194304   float   1131.2   59.33   44.49  0e+00   1130.4   59.37   44.52  0e+00
 Out of bounds values : 0 OK
 Avg bus bandwidth    : 38.53
"""


def gloo_log():
    from sim.calibrate.collectives import bench_collectives, sweep_sizes
    from sim.calibrate.launch import run_workers
    from sim.calibrate.nccl_tests import to_text

    recs = run_workers(_bench, 2, None)[0]
    return to_text(recs, "all_reduce", 2)


def _bench(ctx, _):
    from sim.calibrate.collectives import bench_collectives, sweep_sizes

    return bench_collectives(ctx, sweep_sizes(True, False), repeats=3, ops=("all_reduce",))


def kineto():
    from sim.calibrate.reference import Timing, run_reference
    from sim.calibrate.validate import config_plan, default_model

    model = default_model(True, num_layers=2, hidden_size=32, num_attention_heads=2, vocab_size=64, seq_length=16)
    with tempfile.TemporaryDirectory() as tmp:
        res = run_reference(model, config_plan("1f1b", 2, 1, 2), Timing(warmup=1, iters=1), trace_dir=tmp)
        for r in res:
            data = json.loads(Path(r["trace_file"]).read_text())
            data["traceName"] = f"kineto_rank{r['rank']}.json"
            text = json.dumps(data, separators=(",", ":")) + "\n"
            (HERE / f"kineto_rank{r['rank']}.json.gz").write_bytes(gzip.compress(text.encode(), mtime=0))


if __name__ == "__main__":
    (HERE / "nccl_all_reduce_8gpu.txt").write_text(nccl_text())
    (HERE / "nccl_all_reduce_8gpu.json").write_text(json.dumps(nccl_json(), indent=1) + "\n")
    (HERE / "nccl_no_footer.txt").write_text(nccl_text(footer=False))
    (HERE / "nccl_inplace_only.txt").write_text(nccl_text(inplace_only=True))
    (HERE / "nccl_truncated.txt").write_text(nccl_text(footer=False, cut=True))
    (HERE / "nccl_old_all_gather.txt").write_text(OLD_ALL_GATHER)
    (HERE / "rccl_all_reduce.jsonl").write_text("".join(
        json.dumps({"#wrong": "0", "algBw": a, "busBw": b, "gpus": N, "inPlace": 0, "name": "AllReduce",
                    "redop": "sum", "size": s, "time": t, "type": "float"}) + "\n" for s, _, t, a, b in nccl_rows()))
    (HERE / "gloo_all_reduce_perf.txt").write_text(gloo_log())
    kineto()
    print("fixtures written to", HERE)
