"""``trainsim import-nccl-tests``: α-β of a link kind from nccl-tests results.

Reads one or more nccl-tests outputs (``all_reduce_perf``, ``all_gather_perf``,
``reduce_scatter_perf``, ``sendrecv_perf``, ...; the text log or the JSON file),
fits latency α and bandwidth B with the ring closed forms, prints the fit beside the
measured rows, and with ``--profile IN.json --out OUT.json`` writes a copy of the
profile whose ``--link`` kind carries the fit (its ``sources`` naming the logs). Across
nodes, NCCL spreads a rank's traffic over the node's NICs: ``--links-per-rank`` divides
the fitted B among them. No torch needed.

A log that says which algorithm ran (``NCCL_ALGO``, see ``sim.calibrate.nccl_tests``)
fits that algorithm's own parameters (``sim.calibrate.nccl_tests_algos``): ring logs the
link, NVLS logs ``nvls_efficiency`` and ``nvls_latency_s``; the output and ``--json``
(``fitted``) say which parameters came from which log, and ``--out`` writes them with a
source naming the logs. An algorithm the topology (``--topology``, default the built-in
node of ``--profile``'s GPU) cannot run for the log's op and ranks is an input error.
"""

from __future__ import annotations

import json

from sim.errors import InputError

NAME = "import-nccl-tests"
HELP = "Fit a link kind's latency and bandwidth from nccl-tests logs; optionally write them into a profile."


def add_arguments(p) -> None:
    from sim.inputs.flags import add_section
    from sim.inputs.schema_commands import ImportNcclTestsOptions

    add_section(p, ImportNcclTestsOptions)


def run(args) -> int:
    from sim.calibrate.nccl_tests import apply_to_profile, base_latency_for, fit_link, link_model, load_nccl_tests
    from sim.fileio import check_output_file, write_json_atomic
    from sim.inputs.hardware import load_profile
    from sim.units import parse_size

    if args.out and not args.profile:
        raise InputError("--out: needs --profile (the profile to write the fitted link into)")
    check_output_file(args.out, "--out", suffix=".json")
    min_size = parse_size(args.min_size, "--min-size")
    profile = load_profile(args.profile, flag="--profile") if args.profile else None
    results = [load_nccl_tests(path, op=args.op, ranks=args.ranks) for path in args.logs]
    _check_algos(results, args.topology, profile)
    from sim.calibrate.nccl_tests_algos import apply_nvls, fit_nvls, plan

    which = plan(results)
    fitted, nvls = [], None
    if which["nvls"]:
        nvls = fit_nvls(which["nvls"], _nvlink_rate(args.topology, profile), parse_size(args.min_size, "--min-size"))
        fitted += [{"parameter": k, "value": nvls[k], "logs": [r.source for r in which["nvls"]]}
                   for k in ("nvls_efficiency", "nvls_latency_s")]
    if not which["links"]:
        if nvls is None:
            raise InputError(f"{', '.join(map(str, args.logs))}: no log fits a parameter: "
                             + "; ".join(f"{r.source}: {why}" for r, why in which["none"]))
        if profile is not None and args.out:
            write_json_atomic(apply_nvls(profile, nvls, [r.source for r in which["nvls"]]).to_dict(), args.out)
        return _report_nvls(args, nvls, fitted, which, profile)
    results = which["links"]
    sizes = sorted({r["bytes"] for res in results for r in res.rows if r["bytes"] > 0})
    kept = [s for s in sizes if s >= min_size]
    if len(kept) < 2:
        raise InputError(f"--min-size: got {args.min_size!r}; leaves {len(kept)} of the {len(sizes)} measured sizes "
                         f"(largest {sizes[-1] if sizes else 0} bytes), and the fit needs at least 2")
    try:
        fit = fit_link(results, min_bytes=min_size, base_s=base_latency_for(profile))
    except InputError as exc:
        raise InputError(f"{', '.join(map(str, args.logs))}: {exc}") from None
    model, how = link_model(fit, profile.links.get(args.link) if profile else None, args.links_per_rank)
    fitted += [{"parameter": f"links.{args.link}", "value": {"latency_s": model.latency_s,
               "bandwidth_Bps": model.bandwidth_Bps, "efficiency": model.efficiency}, "logs": [r.source for r in results]}]
    if profile is not None and args.out:
        updated = apply_to_profile(profile, args.link, fit, [r.source for r in results], args.links_per_rank)
        if nvls is not None:
            updated = apply_nvls(updated, nvls, [r.source for r in which["nvls"]])
        write_json_atomic(updated.to_dict(), args.out)
    if args.json:
        print(json.dumps({"link": args.link, "latency_s": fit["latency_s"], "base_latency_s": fit["base_latency_s"], "bandwidth_Bps": fit["bandwidth_Bps"],
                          "rms_rel_error": fit["rms_rel_error"], "points": fit["points"],
                          "link_model": {"latency_s": model.latency_s, "bandwidth_Bps": model.bandwidth_Bps,
                                         "efficiency": model.efficiency},
                          "runs": [{"source": r.source, "op": r.op, "ranks": r.ranks, "rows": len(r.rows),
                                    "complete": r.complete, "avg_busbw_Bps": r.avg_busbw_Bps, "algo": r.algo,
                                    "protocol": r.protocol} for r in results],
                          "fitted": fitted, "not_fitted": [{"source": r.source, "why": why} for r, why in which["none"]]},
                         sort_keys=True))
        return 0
    for r in results:
        note = "" if r.complete else "  (no '# Avg bus bandwidth' footer: the run may have been cut short)"
        print(f"{r.source}: {r.op} on {r.ranks or '?'} ranks, {len(r.rows)} sizes{note}")
        print(f"  {'size':>12} {'time':>12} {'busbw':>10} {'fit':>12}")
        from sim.calibrate.fit import ring_coefficients

        n = 2 if r.op == "send_recv" else r.ranks
        ca, cb = ring_coefficients(r.op, n)
        for row in r.rows:
            pred = ca * fit["latency_s"] + cb * row["bytes"] / fit["bandwidth_Bps"] \
                + (fit["base_latency_s"] if r.op != "send_recv" else 0.0)
            print(f"  {row['bytes']:>12} {row['time_s'] * 1e6:>9.1f} us {row['busbw_Bps'] / 1e9:>6.2f} GB/s "
                  f"{pred * 1e6:>9.1f} us")
    print(f"fit over {fit['points']} points: NCCL base latency {fit['base_latency_s'] * 1e6:.1f} us (taken off), "
          f"alpha {fit['latency_s'] * 1e6:.2f} us, B {fit['bandwidth_Bps'] / 1e9:.2f} GB/s "
          f"(largest busbw {fit['largest_busbw_Bps'] / 1e9:.2f} GB/s), RMS error {fit['rms_rel_error']:.1%}")
    print(f"{args.link}: latency {model.latency_s * 1e6:.2f} us, {how}")
    _print_fitted(fitted, which)
    if profile is not None and args.out:
        print(f"wrote {args.out} (profile {profile.name} with " + ", ".join(f["parameter"] for f in fitted)
              + " from these logs)")
    return 0


def _print_fitted(fitted: list, which: dict) -> None:
    for f in fitted:
        v = f["value"]
        shown = f"{v:.4g}" if isinstance(v, float) else f"latency {v['latency_s'] * 1e6:.2f} us, " \
            f"{v['bandwidth_Bps'] / 1e9:.2f} GB/s x {v['efficiency']:.4g}"
        print(f"fitted {f['parameter']} = {shown} from {', '.join(f['logs'])}")
    for r, why in which["none"]:
        print(f"not fitted from {r.source}: {why}")


def _report_nvls(args, nvls: dict, fitted: list, which: dict, profile) -> int:
    if args.json:
        print(json.dumps({"nvls": nvls, "fitted": fitted, "runs": [{"source": r.source, "op": r.op, "ranks": r.ranks,
                          "rows": len(r.rows), "algo": r.algo, "protocol": r.protocol} for r in which["nvls"]],
                          "not_fitted": [{"source": r.source, "why": why} for r, why in which["none"]]}, sort_keys=True))
        return 0
    print(f"NVLS fit over {nvls['points']} points: {nvls['bandwidth_Bps'] / 1e9:.1f} GB/s per GPU, latency "
          f"{nvls['nvls_latency_s'] * 1e6:.2f} us, RMS error {nvls['rms_rel_error']:.1%}")
    _print_fitted(fitted, which)
    if profile is not None and args.out:
        print(f"wrote {args.out} (profile {profile.name} with nvls_efficiency, nvls_latency_s from these logs)")
    return 0


def _topology_of(name, profile, ranks: int):
    from sim.inputs.topology_build import NODE_OF_GPU, load_topology

    if name is None:
        gpu = profile.name if profile is not None else None
        name = {**NODE_OF_GPU, "a100-40gb": "dgx-a100"}.get(gpu)
        if name is None:
            return None
    return load_topology(name, min_gpus=ranks, flag="--topology")


def _check_algos(results, topology, profile) -> None:
    """A log naming an algorithm its op and ranks cannot run on the topology: one line."""
    from sim.engine.tuner import runnable

    for r in results:
        if r.algo in (None, "ring") or r.ranks is None:
            continue
        topo = _topology_of(topology, profile, r.ranks)
        if topo is None:
            raise InputError(f"--topology: missing; {r.source} names NCCL_ALGO {r.algo}, and checking that it can "
                             "run needs the topology (a built-in name such as dgx-h100, or a TOML file)")
        op = {"all_reduce": "allreduce", "all_gather": "allgather", "reduce_scatter": "reducescatter"}.get(r.op, r.op)
        if not runnable(op, range(r.ranks), topo, r.algo):
            raise InputError(f"{r.source}: NCCL_ALGO: got {r.algo} for {r.op} on {r.ranks} ranks; topology {topo.name} "
                             "cannot run it (nvls: one node with NVLink SHARP; nvls_tree: across such nodes; tree: "
                             "all_reduce only)")


def _nvlink_rate(topology, profile) -> float:
    if profile is not None and "nvlink" in profile.links:
        return profile.links["nvlink"].bandwidth_Bps
    topo = _topology_of(topology, profile, 1)
    if topo is None:
        raise InputError("--profile: missing; an NVLS fit needs the NVLink line rate (give --profile or --topology)")
    g = topo.graph
    return max(d["bandwidth_Bps"] for *_, d in g.edges(data=True) if d["kind"] == "nvlink")
