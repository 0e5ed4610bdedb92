"""Importer for nccl-tests results (``all_reduce_perf`` and friends): text logs and JSON.

Text output, as ``all_reduce_perf -b 8 -e 8G -f 2 -g 8`` prints it: comment lines start
with ``#`` (the command's parameters, one ``#  Rank  N Group ... device ...`` line per
rank, the column header ``size count type redop root time algbw busbw #wrong time algbw
busbw #wrong``, and a footer ``# Avg bus bandwidth : X``); each result row gives the
size in bytes, the element count and type, then time (µs), algbw and busbw (GB/s =
1e9 bytes/s) out-of-place and then in-place. Older versions have no ``root`` column (or
no ``redop`` for the gathers) and call ``#wrong`` ``error``; the header says which, so
columns are found by name. A row may carry only the in-place group (trace replays print
the out-of-place columns blank); the out-of-place time is used when present.

JSON: nccl-tests' own (``"results": [{"size", "count", "type", "out_of_place": {"time",
"alg_bw", "bus_bw"}, "in_place": {...}}]``, the op from ``args[0]``) and rccl-tests'
one-object-per-line form (``{"name": "AllReduce", "size", "time", "algBw", "busBw",
"gpus", "inPlace"}``).

The op comes from the log (``# Collective test starting: all_reduce_perf``, the JSON's
program name), else from the file name, else ``op=``; the number of ranks from the
``# Rank`` lines, else from busbw / algbw (2(n−1)/n for all-reduce, (n−1)/n for the
gathers), else ``ranks=``. ``fit_link`` fits α-β with the ring closed forms
(``sim.calibrate.fit``) and ``link_model`` turns the fit into a profile's ``LinkModel``.
A missing footer is noted (``complete`` false), a file cut inside a row is an error
naming the line.

Which algorithm and protocol ran: a log run with ``NCCL_ALGO`` / ``NCCL_PROTO`` says so in
NCCL's own INFO line (``NCCL INFO NCCL_ALGO set by environment to Tree``, with
``NCCL_DEBUG=INFO``) or in an environment line of the log or its header
(``NCCL_ALGO=NVLS``, ``-x NCCL_PROTO=Simple``); ``algo`` and ``protocol`` carry them in
trainsim's names (None: not said, the tuner chose). NCCL's names Ring, Tree, NVLS,
NVLSTree map to ring, tree, nvls, nvls_tree; a list (``Ring,Tree``) or a ``^`` exclusion
leaves the choice to the tuner (None); CollNet and PAT are not modelled (an error).
``sim.calibrate.nccl_tests_algos`` fits the parameters that belong to the algorithm a
log names (``nvls_efficiency`` and ``nvls_latency_s`` from NVLS logs).
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field, replace
from pathlib import Path

from sim.calibrate.fit import fit_alpha_beta
from sim.errors import InputError
from sim.inputs.hardware import HardwareProfile, LinkModel

_OPS = {"all_reduce": "all_reduce", "allreduce": "all_reduce", "all_gather": "all_gather",
        "allgather": "all_gather", "reduce_scatter": "reduce_scatter", "reducescatter": "reduce_scatter",
        "alltoall": "alltoall", "all_to_all": "alltoall", "broadcast": "broadcast", "reduce": "reduce",
        "sendrecv": "send_recv", "send_recv": "send_recv"}


@dataclass
class NcclTestsResult:
    """One nccl-tests run: rows in SI units."""

    op: str
    ranks: int | None
    rows: list = field(default_factory=list)
    """Each: ``bytes``, ``count``, ``dtype``, ``time_s``, ``algbw_Bps``, ``busbw_Bps``, ``in_place``."""
    avg_busbw_Bps: float | None = None
    complete: bool = True
    """False when the footer (``# Avg bus bandwidth``) is missing: the run may have been cut short."""
    source: str = ""
    algo: str | None = None
    """The algorithm the log says ran (NCCL_ALGO, in trainsim's names), or None."""
    protocol: str | None = None
    """The protocol the log says ran (NCCL_PROTO: ll, ll128, simple), or None."""


_NCCL_ALGOS = {"ring": "ring", "tree": "tree", "nvls": "nvls", "nvlstree": "nvls_tree", "nvls_tree": "nvls_tree"}
_NCCL_PROTOS = {"ll": "ll", "ll128": "ll128", "simple": "simple"}
_ENV = re.compile(r"\b(NCCL_ALGO|NCCL_PROTO)(?:\s*=\s*|\s+set by environment to\s+)([\^A-Za-z0-9_,]+)")


def _env_setting(line: str, found: dict, where: str, lineno: int) -> None:
    """NCCL_ALGO / NCCL_PROTO named on ``line`` into ``found`` (trainsim's names)."""
    for key, value in _ENV.findall(line):
        table = _NCCL_ALGOS if key == "NCCL_ALGO" else _NCCL_PROTOS
        v = value.strip().lower()
        if "," in v or v.startswith("^"):
            found[key] = None  # a list or an exclusion: the tuner still chooses
            continue
        if v not in table:
            allowed = "Ring, Tree, NVLS, NVLSTree" if key == "NCCL_ALGO" else "LL, LL128, Simple"
            raise InputError(f"{where}: line {lineno}: {key}: got {value!r}; allowed: {allowed} (CollNet and PAT "
                             "are not modelled)" if key == "NCCL_ALGO" else
                             f"{where}: line {lineno}: {key}: got {value!r}; allowed: {allowed}")
        found[key] = table[v]


def _op_from(text: str) -> str | None:
    base = Path(text).name.lower()
    for key in sorted(_OPS, key=len, reverse=True):
        if re.search(rf"(^|[^a-z]){key}(_perf|[^a-z]|$)", base):
            return _OPS[key]
    return None


def _canon_op(op: str | None, where: str) -> str | None:
    if op is None:
        return None
    key = op.lower().replace("-", "_")
    if key not in _OPS:
        raise InputError(f"{where}: op: got {op!r}; allowed: {', '.join(sorted(set(_OPS.values())))}")
    return _OPS[key]


def _ranks_from_ratio(op: str, rows: list) -> int | None:
    best = max((r for r in rows if r["algbw_Bps"] > 0), key=lambda r: r["bytes"], default=None)
    if best is None or op in ("broadcast", "reduce", "send_recv"):
        return None
    ratio = best["busbw_Bps"] / best["algbw_Bps"]
    if op == "all_reduce":
        n = 2 / (2 - ratio) if ratio < 2 else None
    else:
        n = 1 / (1 - ratio) if ratio < 1 else None
    if n is None or n < 1.5:
        return None
    return int(round(n))


def parse_text(text: str, where: str = "log", op: str | None = None, ranks: int | None = None) -> NcclTestsResult:
    header, rows, rank_ids, avg, found_op, env = None, [], set(), None, None, {}
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line:
            continue
        if "NCCL_ALGO" in line or "NCCL_PROTO" in line:
            _env_setting(line, env, where, lineno)
        if line.startswith("#"):
            body = line.lstrip("#").strip()
            toks = body.split()
            if "size" in toks and "count" in toks and ("time" in toks or "cputime" in toks):
                header = ["time" if t == "cputime" else ("#wrong" if t == "error" else t) for t in toks]
            m = re.match(r"Rank\s+(\d+)\s+(Group|Pid)", body)
            if m:
                rank_ids.add(int(m.group(1)))
            m = re.match(r"Avg bus bandwidth\s*:\s*([0-9.eE+-]+)", body)
            if m:
                avg = _avg(m.group(1))
            m = re.match(r"Collective test starting:\s*(\S+)", body)
            if m:
                found_op = _op_from(m.group(1))
            continue
        m = re.match(r"Avg bus bandwidth\s*:\s*([0-9.eE+-]+)", line)
        if m:  # older versions print the footer without '#'
            avg = _avg(m.group(1))
            continue
        toks = line.split()
        if not toks[0].isdigit():
            continue  # NCCL INFO/WARN lines mixed into the output
        rows.append(_row(toks, header, where, lineno))
    if not rows:
        raise InputError(f"{where}: no result rows (lines of size count type ... time algbw busbw); "
                         "is this nccl-tests output, and did the run get past its header?")
    op = _canon_op(op, where) or found_op or _op_from(where)
    if op is None:
        raise InputError(f"{where}: op: cannot tell which collective this is; give op (allowed: "
                         f"{', '.join(sorted(set(_OPS.values())))})")
    n = ranks or (len(rank_ids) if len(rank_ids) > 1 else None) or _ranks_from_ratio(op, rows)
    return NcclTestsResult(op, n, rows, avg, avg is not None, where, env.get("NCCL_ALGO"), env.get("NCCL_PROTO"))


def _avg(text: str) -> float | None:
    """The footer's average bus bandwidth in bytes/s (None when it is not a number)."""
    try:
        v = float(text) * 1e9
    except ValueError:
        return None
    return v if math.isfinite(v) else None


def _layout(header: list | None) -> tuple[list, int, int]:
    """(leading column names, columns per time group, groups) from the header."""
    if not header or "time" not in header:
        return ["size", "count", "type", "redop", "root"], 4, 2
    first = header.index("time")
    times = [i for i, t in enumerate(header) if t == "time"]
    group = (times[1] - times[0]) if len(times) > 1 else len(header) - first
    return header[:first], group, len(times)


def _row(toks: list, header: list | None, where: str, lineno: int) -> dict:
    lead, group, groups = _layout(header)
    rest = toks[len(lead):]
    if len(rest) not in (group, group * groups):
        raise InputError(f"{where}: line {lineno}: got {len(toks)} columns, expected {len(lead) + group * groups} "
                         f"({' '.join(lead)}, then time algbw busbw #wrong out-of-place and in-place); "
                         "the file looks truncated")
    vals = dict(zip(lead, toks))
    in_place = len(rest) == group and groups > 1  # out-of-place columns left blank
    try:
        t_us, alg, bus = float(rest[0]), float(rest[1]), float(rest[2])
        nbytes, count = int(vals["size"]), int(vals.get("count", 0))
    except (ValueError, KeyError):
        raise InputError(f"{where}: line {lineno}: got {' '.join(toks)!r}; expected numbers for size, time, "
                         "algbw and busbw; the file looks truncated or garbled") from None
    for name, v, unit in (("time", t_us, "microseconds"), ("algbw", alg, "GB/s"), ("busbw", bus, "GB/s")):
        _check_measure(f"{where}: line {lineno}: {name}", v, unit, positive=name == "time")
    return {"bytes": nbytes, "count": count, "dtype": vals.get("type", ""), "time_s": t_us * 1e-6,
            "algbw_Bps": alg * 1e9, "busbw_Bps": bus * 1e9, "in_place": in_place}


def _check_measure(field: str, v, unit: str, positive: bool = False) -> None:
    """A measured number: finite, >= 0 (> 0 with ``positive``)."""
    ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and (v > 0 if positive else v >= 0)
    if not ok:
        raise InputError(f"{field}: got {v!r}; expected a finite number of {unit} {'> 0' if positive else '>= 0'}")


def _json_row(rec: dict, body: dict, where: str, names: tuple) -> dict:
    """One measurement of nccl-tests' (``names``: size, time, alg_bw, bus_bw keys) or
    rccl-tests' JSON, checked."""
    size_k, time_k, alg_k, bus_k = names
    size = rec.get(size_k)
    if isinstance(size, bool) or not isinstance(size, int) or size < 0:
        raise InputError(f"{where}: {size_k}: got {size!r}; expected a number of bytes (an integer >= 0)")
    count = rec.get("count", 0)
    if isinstance(count, str) and count.strip().isdigit():
        count = int(count)
    if isinstance(count, bool) or not isinstance(count, int) or count < 0:
        raise InputError(f"{where}: count: got {count!r}; expected an integer >= 0")
    vals = {}
    for key, unit in ((time_k, "microseconds"), (alg_k, "GB/s"), (bus_k, "GB/s")):
        if key not in body:
            raise InputError(f"{where}: {key}: missing; expected a number of {unit}")
        _check_measure(f"{where}: {key}", body[key], unit, positive=key == time_k)
        vals[key] = float(body[key])
    return {"bytes": size, "count": count, "dtype": str(rec.get("type", "")), "time_s": vals[time_k] * 1e-6,
            "algbw_Bps": vals[alg_k] * 1e9, "busbw_Bps": vals[bus_k] * 1e9}


def parse_json(data, where: str = "json", op: str | None = None, ranks: int | None = None) -> NcclTestsResult:
    if isinstance(data, list):  # rccl-tests: one object per measurement
        rows, names, gpus = [], set(), set()
        if not data:
            raise InputError(f"{where}: no result records (an empty list); the run produced no measurement")
        for i, d in enumerate(data):
            if not isinstance(d, dict):
                raise InputError(f"{where}: record {i}: got {d!r}; expected an object with size, time, algBw "
                                 "and busBw")
            row = _json_row(d, d, f"{where}: record {i}", ("size", "time", "algBw", "busBw"))
            rows.append({**row, "in_place": bool(d.get("inPlace", 0))})
            names.add(str(d.get("name", "")))
            gpus.add(d.get("gpus"))
        oop = [r for r in rows if not r["in_place"]] or rows
        first = _canon_op(op, where) or _op_from(re.sub(r"(?<!^)([A-Z])", r"_\1", sorted(names)[0]).lower())
        n = ranks or (next(iter(gpus)) if len(gpus) == 1 and isinstance(next(iter(gpus)), int) else None)
        if first is None:
            raise InputError(f"{where}: op: got {sorted(names)!r}; give op")
        return NcclTestsResult(first, n or _ranks_from_ratio(first, oop), oop, None, True, where)
    if not isinstance(data, dict) or not isinstance(data.get("results"), list):
        raise InputError(f"{where}: results: missing; expected nccl-tests JSON output (a 'results' list)")
    rows = []
    for i, r in enumerate(data["results"]):
        at = f"{where}: results[{i}]"
        if not isinstance(r, dict):
            raise InputError(f"{at}: got {r!r}; expected an object with size and out_of_place or in_place")
        body = r.get("out_of_place") or r.get("in_place")
        if not isinstance(body, dict) or "size" not in r:
            raise InputError(f"{at}: expected size and an out_of_place or in_place object")
        part = "out_of_place" if r.get("out_of_place") else "in_place"
        if "time" not in body and "cpu_time" in body:
            body = {**body, "time": body["cpu_time"]}
        row = _json_row(r, body, at, ("size", "time", "alg_bw", "bus_bw"))
        rows.append({**row, "in_place": part == "in_place"})
    if not rows:
        raise InputError(f"{where}: results: empty; the run produced no measurement")
    args = data.get("args", [])
    if not isinstance(args, list):
        raise InputError(f"{where}: args: got {args!r}; expected the list of the command's arguments")
    found = _op_from(str(args[0])) if args else None
    op = _canon_op(op, where) or found or _op_from(where)
    if op is None:
        raise InputError(f"{where}: op: cannot tell which collective this is; give op")
    average = data.get("average_bus_bandwidth") or {}
    if not isinstance(average, dict):
        raise InputError(f"{where}: average_bus_bandwidth: got {average!r}; expected an object with a bandwidth")
    avg = average.get("bandwidth")
    config = data.get("config") or {}
    if not isinstance(config, dict):
        raise InputError(f"{where}: config: got {config!r}; expected an object")
    devices = config.get("devices") or []
    if not isinstance(devices, list):
        raise InputError(f"{where}: config.devices: got {devices!r}; expected a list")
    n = ranks or (len(devices) if len(devices) > 1 else None) or _ranks_from_ratio(op, rows)
    ok_avg = isinstance(avg, (int, float)) and not isinstance(avg, bool) and math.isfinite(avg)
    return NcclTestsResult(op, n, rows, float(avg) * 1e9 if ok_avg else None,
                           "end_time" in data or avg is not None, where)


def load_nccl_tests(path, op: str | None = None, ranks: int | None = None) -> NcclTestsResult:
    """Parse a text or JSON nccl-tests result file (see the module doc)."""
    from sim.fileio import read_text

    where = str(path)
    text = read_text(path, "nccl-tests log")
    stripped = text.lstrip()
    if stripped.startswith("{") or stripped.startswith("["):
        try:
            data = json.loads(text)
        except json.JSONDecodeError:  # rccl-tests: one JSON object per line
            lines = text.splitlines()
            data = [_json_line(line, where, i) for i, line in enumerate(lines, 1) if line.strip()]
        return parse_json(data, where, op, ranks)
    return parse_text(text, where, op, ranks)


def _json_line(line: str, where: str, lineno: int):
    try:
        return json.loads(line)
    except json.JSONDecodeError as exc:
        raise InputError(f"{where}:{lineno}: not valid JSON ({exc.msg}, column {exc.colno}); the file looks "
                         "truncated or garbled") from None


def fit_link(results, min_bytes: int = 0, base_s: float = 0.0) -> dict:
    """α-β over every row of every result (sizes below ``min_bytes`` left out), each
    collective's time less ``base_s``, the base latency the simulator will add to it
    (``fit_alpha_beta``; ``base_latency_for`` gives a profile's)."""
    points = []
    for res in results:
        n = 2 if res.op == "send_recv" else res.ranks
        if n is None:
            raise InputError(f"{res.source}: ranks: unknown for op {res.op}; give ranks")
        points += [(res.op, n, r["bytes"], r["time_s"]) for r in res.rows if r["bytes"] >= min_bytes and r["bytes"] > 0]
    fit = fit_alpha_beta(points, base_s)
    fit["largest_busbw_Bps"] = max(r["busbw_Bps"] for res in results for r in res.rows)
    return fit


def base_latency_for(profile) -> float:
    """The base latency the simulator adds to a ring collective in Simple (NCCL's protocol
    for the large sizes an α-β fit rests on) under ``profile`` (None: NCCL's table)."""
    from sim.engine.nccl import NcclModel

    return NcclModel.from_profile(profile).base_latency_s["ring"]["simple"]


def link_model(fit: dict, base: LinkModel | None, links_per_rank: int = 1) -> tuple[LinkModel, str]:
    """A ``LinkModel`` from a fit: the fitted B is spread over ``links_per_rank`` links (the
    NICs each rank's traffic uses); the base's line rate is kept when the result fits
    under it, and the efficiency is what was achieved of it."""
    per_link = fit["bandwidth_Bps"] / max(1, links_per_rank)
    if base is not None and per_link <= base.bandwidth_Bps:
        return (LinkModel(fit["latency_s"], base.bandwidth_Bps, per_link / base.bandwidth_Bps),
                f"line rate {base.bandwidth_Bps / 1e9:.1f} GB/s kept, efficiency = fitted {per_link / 1e9:.2f} GB/s over it")
    return LinkModel(fit["latency_s"], per_link, 1.0), f"bandwidth = fitted {per_link / 1e9:.2f} GB/s, efficiency 1"


def apply_to_profile(profile: HardwareProfile, kind: str, fit: dict, sources: list[str],
                     links_per_rank: int = 1) -> HardwareProfile:
    """``profile`` with link ``kind`` replaced by the fit, its source naming the logs."""
    from sim.inputs.hardware import LINK_KINDS

    if kind not in LINK_KINDS:
        raise InputError(f"--link: got {kind!r}; allowed: {', '.join(LINK_KINDS)}")
    model, how = link_model(fit, profile.links.get(kind), links_per_rank)
    text = (f"fitted from nccl-tests ({', '.join(sources)}): ring closed forms over {fit['points']} sizes, "
            f"alpha {fit['latency_s'] * 1e6:.2f} us, B {fit['bandwidth_Bps'] / 1e9:.2f} GB/s"
            f"{f' after NCCL base latency {b * 1e6:.1f} us' if (b := fit.get('base_latency_s')) else ''}"
            f"{f' over {links_per_rank} links per rank' if links_per_rank > 1 else ''}, "
            f"RMS error {fit['rms_rel_error']:.1%}; {how}")
    return replace(profile, links={**profile.links, kind: model}, sources={**profile.sources, f"links.{kind}": text})


def to_text(records, op: str, ranks: int, program: str = "") -> str:
    """Collective records (``sim.calibrate.collectives``) of one op in nccl-tests' text
    layout, so measurements made here read like (and import like) an nccl-tests log.
    The in-place columns repeat the out-of-place ones (one measurement per size)."""
    rows = [r for r in records if r["op"] == op]
    if not rows:
        raise InputError(f"op: got {op!r}; no records of it")
    name = program or f"{op.replace('send_recv', 'sendrecv')}_perf (trainsim calibrate, torch.distributed)"
    lines = [f"# Collective test starting: {name}", "#", "# Using devices"]
    lines += [f"#  Rank {r:2d} Group  0 Pid      0 on  localhost device  0 [cpu] process {r}" for r in range(ranks)]
    lines += ["#", "#       size         count      type   redop    root     time   algbw   busbw #wrong     time"
              "   algbw   busbw #wrong", "#        (B)    (elements)                               (us)  (GB/s)  (GB/s)"
              "            (us)  (GB/s)  (GB/s)"]
    total = 0.0
    for r in rows:
        body = f"{r['time_s'] * 1e6:8.2f} {r['algbw_Bps'] / 1e9:7.4f} {r['busbw_Bps'] / 1e9:7.4f}      0"
        lines.append(f"{r['bytes']:12d} {r['bytes'] // 4:13d}     float     sum      -1 {body} {body}")
        total += r["busbw_Bps"] / 1e9
    lines += ["# Out of bounds values : 0 OK", f"# Avg bus bandwidth    : {total / len(rows):.6g} ", "#"]
    return "\n".join(lines) + "\n"
