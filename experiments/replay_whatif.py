"""Replay of profiler traces (``trainsim replay``): how close to the trace, and what-ifs.

1. Self-consistency on the real PyTorch profiler traces in ``../shared/traces`` (skipped
   when the folder is absent): the replayed step against the measured one, and a picture
   of the 2-rank all-reduce trace's measured step beside its replay.
2. What-ifs on a job trainsim simulated itself (GPT 2 layers, h 2048, on 64 H100s,
   tp 8 x dp 8; its ``run --kineto`` traces replayed): doubled data parallelism, a fat-tree
   with oversubscription 4, H200s, each beside a direct ``trainsim run`` of the changed
   plan, as a bar chart.

    python experiments/replay_whatif.py [--out DIR] [--docs]     # --docs: copy the pictures to docs/img

Writes ``replay_whatif.csv``, ``results.json``, ``replay-real-measured.png``,
``replay-real-replayed.png`` and ``replay-whatif.png`` under ``experiments/out/replay_whatif/``.
"""

from __future__ import annotations

import argparse
import glob
import io
import json
import shutil
import sys
import tempfile
import time
from contextlib import redirect_stdout
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from experiments.common import pyplot, save, write_csv, write_json  # noqa: E402
from sim.cli import main as cli  # noqa: E402

SHARED = ROOT.parent / "shared" / "traces"
REAL = {
    "2 ranks, NCCL all-reduce (A100)": (["hta-nccl-allreduce-2ranks-rank0.json.gz"], []),
    "16 ranks, send/recv (A100), rank 0 traced": (["hta-16ranks-rank0.json.gz"], []),
    "128 ranks, ranks 0-1 traced": (["hta-128ranks-sampled-rank0.json.gz", "hta-128ranks-sampled-rank1.json.gz"],
                                    ["--gpu", "a100-80gb"]),
    "event sync, 3 streams": (["hta-event-sync-multistream.json.gz"], []),
    "alexnet, 1 GPU": (["hta-alexnet-1gpu.json.gz"], []),
}
MODEL = ["--num-layers", "2", "--hidden-size", "2048", "--num-attention-heads", "16", "--vocab-size", "32000",
         "--seq-length", "1024", "--gpu", "h100-sxm"]
PLAN = ["--gpus", "64", "--tensor-model-parallel-size", "8", "--global-batch-size", "8"]
WHAT_IFS = [  # label, replay flags, the changed plan's run flags
    ("as traced (64 H100, rail)", [], []),
    ("dp 16 (128 GPUs)", ["--data-parallel-size", "16"], ["--gpus", "128", "--global-batch-size", "16"]),
    ("fat-tree, oversubscription 4", ["--fabric", "fat-tree", "--oversubscription", "4"],
     ["--fabric", "fat-tree", "--oversubscription", "4"]),
    ("H200", ["--gpu", "h200"], ["--gpu", "h200"]),
]


def js(argv) -> dict:
    buf = io.StringIO()
    with redirect_stdout(buf):
        rc = cli([str(a) for a in argv])
    if rc != 0:
        raise SystemExit(f"failed: {' '.join(map(str, argv))}")
    return json.loads(buf.getvalue())


def _with(argv, extra):
    out = list(argv)
    for i in range(0, len(extra), 2):
        if extra[i] in out:
            out[out.index(extra[i]) + 1] = extra[i + 1]
        else:
            out += extra[i:i + 2]
    return out


def real_traces(out: Path) -> list[dict]:
    rows = []
    if not SHARED.is_dir():
        print(f"{SHARED} is absent: the real traces are skipped")
        return rows
    for label, (files, flags) in REAL.items():
        t = time.perf_counter()
        s = js(["replay", *[SHARED / f for f in files], *flags, "--json"])
        rows.append({"trace": label, "step": s["step"], "traced_ms": s["traced_step_s"] * 1e3,
                     "replayed_ms": s["iteration_time_s"] * 1e3,
                     "error_pct": (s["iteration_time_s"] / s["traced_step_s"] - 1) * 100,
                     "ranks": s["world_size"], "cloned": s["cloned_ranks"], "comm_measured": s["comm_measured"],
                     "wall_s": time.perf_counter() - t})
        print(f"{label}: traced {rows[-1]['traced_ms']:.3f} ms, replayed {rows[-1]['replayed_ms']:.3f} ms "
              f"({rows[-1]['error_pct']:+.2f}%)")
    _timelines(out)
    return rows


def _timelines(out: Path) -> None:
    """The 2-rank trace's step 6 as measured, and as replayed: the GPU streams of both,
    each kernel coloured by its class (``sim.replay.kineto.kernel_category``)."""
    from sim.calibrate.kineto import load_kineto
    from sim.replay.kineto import NCCL, kernel_category, read_kineto, steps_of
    from sim.replay.run import replay
    from sim.results.plot import TimelineView, plot_timeline
    from sim.results.trace import Span, Trace

    path = SHARED / "hta-nccl-allreduce-2ranks-rank0.json.gz"
    graph = read_kineto(path, 6)
    data = load_kineto(path)
    t0 = steps_of(data)[6]["ts"]
    t1 = t0 + graph.traced_step_s * 1e6
    spans = []
    for i, e in enumerate(data["traceEvents"]):
        if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset") and t0 <= e["ts"] < t1:
            comm = bool(NCCL.match(e["name"]))  # (a name per kernel: the plot merges same-named compute spans)
            spans.append(Span(0, f"stream {e['args'].get('stream')}", f"{e['name'][:60]} #{i}",
                              "collective" if comm else "compute",
                              "comm" if comm else kernel_category(e["name"], e["cat"]), (e["ts"] - t0) * 1e-6,
                              (e["ts"] + e["dur"] - t0) * 1e-6))
    spans.sort(key=lambda s: (s.rank, s.stream, s.start_s, s.end_s))
    measured = Trace(spans, [], {}, {}, ranks={0: {"node": 0, "device": "gpu0"}})
    plot_timeline(measured, out / "replay-real-measured.png", TimelineView(
        title=f"measured: ProfilerStep#6 of rank 0, GPU streams, {graph.traced_step_s * 1e3:.1f} ms", collapse=False))
    r = replay([graph])
    gpu = Trace([s for s in r.trace.spans if s.rank == 0 and s.stream.startswith("stream")], [], {}, {},
                ranks={0: {"node": 0, "device": "gpu0"}})
    plot_timeline(gpu, out / "replay-real-replayed.png", TimelineView(
        title=f"replayed: GPU streams, {r.summary['iteration_time_s'] * 1e3:.1f} ms", collapse=False))


def what_ifs(out: Path) -> list[dict]:
    d = Path(tempfile.mkdtemp())
    base = js(["run", *MODEL, *PLAN, "--json", "--kineto", d])
    files = sorted(glob.glob(str(d / "*.json")))
    rows = []
    for label, replay_flags, run_flags in WHAT_IFS:
        rep = js(["replay", *files, *replay_flags, "--json"])
        direct = base if not run_flags else js(["run", *_with(MODEL + PLAN, run_flags), "--json"])
        rows.append({"what_if": label, "replayed_ms": rep["iteration_time_s"] * 1e3,
                     "run_ms": direct["iteration_time_s"] * 1e3,
                     "error_pct": (rep["iteration_time_s"] / direct["iteration_time_s"] - 1) * 100})
        print(f"{label}: replay {rows[-1]['replayed_ms']:.3f} ms, run {rows[-1]['run_ms']:.3f} ms "
              f"({rows[-1]['error_pct']:+.2f}%)")
    shutil.rmtree(d, ignore_errors=True)
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(8, 3.6))
    xs = range(len(rows))
    ax.bar([x - 0.2 for x in xs], [r["replayed_ms"] for r in rows], 0.4, label="trainsim replay of the traces")
    ax.bar([x + 0.2 for x in xs], [r["run_ms"] for r in rows], 0.4, label="trainsim run of the changed plan")
    ax.set_xticks(list(xs), [r["what_if"] for r in rows], fontsize=8)
    ax.set_ylabel("iteration time (ms)")
    ax.set_title("What-ifs on a replayed job (GPT h2048, 64 H100, tp 8 x dp 8)", fontsize=10)
    ax.legend(fontsize=8)
    save(fig, out / "replay-whatif.png")
    return rows


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=str(ROOT / "experiments" / "out" / "replay_whatif"))
    p.add_argument("--docs", action="store_true", help="copy the pictures to docs/img")
    args = p.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    real = real_traces(out)
    whatif = what_ifs(out)
    write_csv(out / "replay_whatif.csv",
              [dict(r, part="real") for r in real] + [dict(r, part="what-if") for r in whatif])
    results = {"real": real, "what_if": whatif}
    write_json(out / "results.json", results)
    if args.docs:
        for name in ("replay-real-measured.png", "replay-real-replayed.png", "replay-whatif.png"):
            if (out / name).exists():
                shutil.copyfile(out / name, ROOT / "docs" / "img" / name)
    return results


if __name__ == "__main__":
    main()
