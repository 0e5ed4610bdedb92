"""Pipeline schedules as data: per-rank lists of steps, like PyTorch pipelining.

A pipeline-parallel iteration splits the model into ``pp * vpp`` *virtual stages*
(model chunks) and the batch into ``m`` micro-batches. Chunk ``c`` of pipeline rank
``r`` is virtual stage ``c * pp + r`` (Megatron's interleaving). A ``Step`` is one
stage x kind x micro-batch, written as text the way PyTorch's
``torch/distributed/pipelining/schedules.py`` writes its actions: ``2F0`` is the
forward of stage 2 on micro-batch 0. Kinds: ``F`` forward, ``B`` full backward, and
the zero-bubble split of the backward into ``I`` (input gradient, on the critical
path) and ``W`` (weight gradient, which only has to happen before the optimizer).

A ``Schedule`` is nothing but each rank's steps in execution order. Its data
dependencies are fixed by the model (``step_deps``): F(s,j) needs F(s-1,j); B or I of
(s,j) needs F(s,j) and the input gradient of stage s+1; W(s,j) needs I(s,j). So any
order a user writes down can be checked (``validate``, in ``sim.program.schedule_io``, with a
step x rank grid pointing at the problem), saved and loaded as CSV, and turned into a
compute-only ``Program`` (``to_program``) that later passes give communication to.

The generators, with the closed forms the tests check (free communication, per-rank
times t_f, t_b = T_B + T_W; p = pp, v = vpp):

- ``gpipe``: all forwards, then all backwards in micro-batch order 0..m-1 (as PyTorch's
  ``ScheduleGPipe``). Time (m + p - 1)(t_f + t_b); bubble (p-1)/(m+p-1) of the total
  (GPipe, Huang et al. 2019); stashes activations of all m micro-batches.
- ``one_f_one_b``: PipeDream-Flush / Megatron's non-interleaved schedule: rank r runs
  min(p-1-r, m) warm-up forwards, then one forward one backward, then the remaining
  backwards. Same time as GPipe but at most p micro-batches in flight
  (Narayanan et al. SC'21: bubble fraction (p-1)/m of ideal compute).
- ``interleaved``: Megatron's ``forward_backward_pipelining_with_interleaving``: v
  chunks per rank, micro-batches taken in groups of p, warm-up
  (p-r-1)*2 + (v-1)*p (all of it when m == p). Bubble "(p-1)/v * (t_f + t_b)", i.e.
  (p-1)/(v*m) of ideal (Narayanan et al. SC'21, Sec. 2.2.2); needs m % p == 0.
- ``zb_h1`` / ``zb_h2``: Qi et al., "Zero Bubble Pipeline Parallelism" (ICLR 2024),
  Sec. 2 and Table 2: ZB-H1 keeps 1F1B's order with I for B, but rank r delays its W
  passes by r micro-batches, so every rank holds at most p micro-batches (p*M_B, as
  1F1B) and the bubble is "(p-1)(T_F + T_B - T_W)". ZB-H2 runs extra warm-up forwards
  (up to 2p-1 in flight, "(2p-1)M_B") and defers W to the tail, turning the trapezoid
  into a parallelogram: bubble "(p-1)(T_F + T_B - 2T_W)", zero when T_F = T_B = T_W.
  Here T_B is the input-gradient pass I. The paper counts a rank's bubble from its
  own first to its own last pass (the optimizer step is not a barrier once it is
  post-validated, Sec. 4); the tests count it the same way.
  ZB-H2's order is made by a greedy list scheduler with unit pass times (I first,
  then F while under the in-flight limit 2p-1, else the oldest W): on T_F = T_I = T_W
  it gives exactly the paper's parallelogram (every rank reaches 2p-1 in flight for
  m >= 2p-1, counting micro-batches whose I is done but W is pending). Measured, both
  forms hold exactly when T_W <= T_F (for ZB-H2 also T_F + T_B >= 2T_W); with a W
  longer than F the saving per deferred W is capped at T_F, i.e. the bubble is
  (p-1)(T_F + T_B - min(T_W, T_F)) for ZB-H1 (see the tests).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cached_property
from typing import Callable

from sim.program.actions import Action, Program
from sim.errors import InputError

KINDS = ("F", "B", "I", "W")
SCHEDULES = ("gpipe", "1f1b", "interleaved", "zb-h1", "zb-h2", "looped-bfs")

_STEP_RE = re.compile(r"(0|[1-9][0-9]*)([FBIW])(0|[1-9][0-9]*)")


@dataclass(frozen=True, order=True)
class Step:
    """One pass of one micro-batch through one virtual stage."""

    stage: int
    """Virtual stage (model chunk) 0 .. pp*vpp-1; chunk c of rank r is stage c*pp + r."""
    kind: str
    """F forward, B full backward, I input-grad only, W weight-grad only."""
    mb: int
    """Micro-batch index 0 .. m-1."""

    def __post_init__(self):
        for key in ("stage", "mb"):
            v = getattr(self, key)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise InputError(f"step {key}: got {v!r}; expected an integer >= 0")
        if self.kind not in KINDS:
            raise InputError(f"step kind: got {self.kind!r}; allowed: {', '.join(KINDS)}")

    def __str__(self) -> str:
        return f"{self.stage}{self.kind}{self.mb}"

    @classmethod
    def parse(cls, text: str) -> "Step":
        """``"2F0"`` -> ``Step(2, "F", 0)``; strict (no spaces, no leading zeros)."""
        m = _STEP_RE.fullmatch(text) if isinstance(text, str) else None
        if m is None:
            raise InputError(
                f"step {text!r}: expected <stage><kind><micro-batch> such as '2F0', kind one of {', '.join(KINDS)}"
            )
        return cls(int(m.group(1)), m.group(2), int(m.group(3)))


@dataclass(frozen=True)
class Schedule:
    """Each pipeline rank's steps, in the order that rank runs them."""

    name: str
    pp: int
    vpp: int
    num_microbatches: int
    ranks: tuple[tuple[Step, ...], ...]
    """``ranks[r]``: pipeline rank r's steps in execution order."""

    def __post_init__(self):
        for key in ("pp", "vpp", "num_microbatches"):
            v = getattr(self, key)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise InputError(f"schedule {self.name}: {key}: got {v!r}; expected an integer >= 1")
        ranks = tuple(tuple(row) for row in self.ranks)
        if len(ranks) != self.pp:
            raise InputError(f"schedule {self.name}: has {len(ranks)} rank rows; expected pp = {self.pp}")
        for r, row in enumerate(ranks):
            for s in row:
                if not isinstance(s, Step):
                    raise InputError(f"schedule {self.name}: rank {r}: {s!r} is not a Step")
        object.__setattr__(self, "ranks", ranks)

    @property
    def num_stages(self) -> int:
        return self.pp * self.vpp

    def owner(self, stage: int) -> int:
        """The pipeline rank that holds virtual stage ``stage``."""
        return stage % self.pp

    @cached_property
    def step_set(self) -> frozenset[Step]:
        return frozenset(s for row in self.ranks for s in row)

    def __str__(self) -> str:
        return "\n".join(" ".join(str(s) for s in row) for row in self.ranks)


# ---------------------------------------------------------------------- dependencies
def step_deps(step: Step, schedule: Schedule) -> tuple[Step, ...]:
    """The steps whose results ``step`` consumes (data dependencies only).

    F(s,j) <- F(s-1,j); B(s,j) or I(s,j) <- F(s,j) and, below the last stage, the input
    gradient of stage s+1 (its I if the schedule splits that backward, else its B);
    W(s,j) <- I(s,j).
    """
    s, j = step.stage, step.mb
    if step.kind == "F":
        return (Step(s - 1, "F", j),) if s > 0 else ()
    if step.kind == "W":
        return (Step(s, "I", j),)
    deps = [Step(s, "F", j)]
    if s < schedule.num_stages - 1:
        split = Step(s + 1, "I", j)
        deps.append(split if split in schedule.step_set else Step(s + 1, "B", j))
    return tuple(deps)


def to_program(schedule: Schedule, duration: Callable[[Step], float]) -> Program:
    """A compute-only ``Program`` on ranks 0..pp-1, one action per step.

    Each action is named by the step's text form, has category = kind and depends on
    its ``step_deps`` as (owner rank, name) references. Cross-rank dependencies stand
    for free communication; passes replace them with p2p send/recv. Run ``validate``
    first on a schedule you did not generate (the engine would report a deadlock too,
    but without the grid).
    """
    acts: dict[int, list[Action]] = {}
    for r, row in enumerate(schedule.ranks):
        acts[r] = [
            Action(name=str(st), kind="compute", stream="compute", duration_s=duration(st), category=st.kind,
                   deps=tuple((schedule.owner(d.stage), str(d)) for d in step_deps(st, schedule)))
            for st in row
        ]
    return Program(acts)


def in_flight(schedule: Schedule) -> tuple[int, ...]:
    """Per rank, the most (stage, micro-batch) pairs whose forward has run and whose
    backward (B, or W when split) has not: the activations that rank holds at once.
    With vpp > 1 a pair is one chunk's worth (1/vpp of a rank's layers)."""
    out = []
    for row in schedule.ranks:
        live = peak = 0
        for st in row:
            if st.kind == "F":
                live += 1
                peak = max(peak, live)
            elif st.kind in ("B", "W"):
                live -= 1
        out.append(peak)
    return tuple(out)


# ---------------------------------------------------------------------- generators
def _check(name: str, pp: int, m: int, vpp: int = 1) -> None:
    for key, v in (("pp", pp), ("num_microbatches", m), ("vpp", vpp)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise InputError(f"schedule {name}: {key}: got {v!r}; expected an integer >= 1")


def gpipe(pp: int, m: int) -> Schedule:
    """All m forwards, then all m backwards (micro-batch order 0..m-1) on every rank."""
    _check("gpipe", pp, m)
    ranks = tuple(
        tuple(Step(r, "F", j) for j in range(m)) + tuple(Step(r, "B", j) for j in range(m)) for r in range(pp)
    )
    return Schedule("gpipe", pp, 1, m, ranks)


def _one_f_one_b_rank(r: int, pp: int, m: int, bwd: str) -> list[Step]:
    warm = min(pp - 1 - r, m)
    row = [Step(r, "F", j) for j in range(warm)]
    for j in range(m):
        if j + warm < m:
            row.append(Step(r, "F", j + warm))
        row.append(Step(r, bwd, j))
    return row


def one_f_one_b(pp: int, m: int) -> Schedule:
    """PipeDream-Flush: min(p-1-r, m) warm-up forwards, then 1F1B, then the cool-down."""
    _check("1f1b", pp, m)
    return Schedule("1f1b", pp, 1, m, tuple(tuple(_one_f_one_b_rank(r, pp, m, "B")) for r in range(pp)))


def interleaved(pp: int, vpp: int, m: int, extra_warmup: int = 0) -> Schedule:
    """Megatron's interleaved 1F1B with ``vpp`` chunks per rank (m a multiple of pp).

    The k-th forward of a rank (k = 0 .. m*v-1) is chunk (k mod p*v) // p of
    micro-batch (k // p*v)*p + k mod p; its k-th backward walks the chunks in reverse.
    ``extra_warmup`` more warm-up forwards (Megatron adds one under
    ``overlap_moe_expert_parallel_comm``, so that each steady-state forward and the
    backward beside it are of different micro-batches; ``sim.program.ep_overlap``).
    """
    _check("interleaved", pp, m, vpp)
    if vpp < 2:
        raise InputError(f"schedule interleaved: vpp: got {vpp}; interleaving needs vpp >= 2 chunks per rank")
    if m % pp:
        raise InputError(
            f"schedule interleaved: num_microbatches: got {m}; must be a multiple of pp = {pp} (Megatron's rule)"
        )
    total = m * vpp

    def step(r: int, k: int, kind: str) -> Step:
        chunk = (k % (pp * vpp)) // pp
        if kind != "F":
            chunk = vpp - 1 - chunk
        return Step(chunk * pp + r, kind, (k // (pp * vpp)) * pp + k % pp)

    ranks = []
    for r in range(pp):
        warm = total if m == pp else min((pp - r - 1) * 2 + (vpp - 1) * pp + extra_warmup, total)
        row = [step(r, k, "F") for k in range(warm)]
        for k in range(total - warm):
            row += [step(r, k + warm, "F"), step(r, k, "B")]
        row += [step(r, k, "B") for k in range(total - warm, total)]
        ranks.append(tuple(row))
    return Schedule("interleaved", pp, vpp, m, tuple(ranks))


def looped_bfs(pp: int, vpp: int, m: int) -> Schedule:
    """Breadth-first pipeline parallelism (Lamy-Poirier, "Breadth-First Pipeline
    Parallelism", MLSys 2023; PyTorch's ``ScheduleLoopedBFS``, whose
    ``_calculate_single_rank_operations`` gives this order): rank r runs the forwards of
    every micro-batch through its chunk 0, then through chunk 1, and so on; then the
    backwards chunk by chunk in reverse, each chunk's micro-batches last first. Any vpp
    (1: GPipe with the backwards reversed) and any m; every chunk holds all m micro-batches
    at the end of the forwards, as GPipe does."""
    _check("looped-bfs", pp, m, vpp)
    ranks = tuple(tuple(Step(c * pp + r, "F", j) for c in range(vpp) for j in range(m))
                  + tuple(Step(c * pp + r, "B", j) for c in reversed(range(vpp)) for j in reversed(range(m)))
                  for r in range(pp))
    return Schedule("looped-bfs", pp, vpp, m, ranks)


def zb_h1(pp: int, m: int) -> Schedule:
    """ZB-H1: 1F1B with I in place of B; rank r runs W(j-r) right after I(j), and the
    last r W passes at the end (so at most p micro-batches are in flight)."""
    _check("zb-h1", pp, m)
    ranks = []
    for r in range(pp):
        row = []
        for st in _one_f_one_b_rank(r, pp, m, "I"):
            row.append(st)
            if st.kind == "I" and st.mb >= r:
                row.append(Step(r, "W", st.mb - r))
        row += [Step(r, "W", j) for j in range(max(0, m - r), m)]
        ranks.append(tuple(row))
    return Schedule("zb-h1", pp, 1, m, tuple(ranks))


def zb_h2(pp: int, m: int) -> Schedule:
    """ZB-H2: list-schedule with unit pass times and at most 2p-1 micro-batches in
    flight per rank: at each step a rank runs its next I if ready, else its next F if
    ready and under the limit, else its oldest pending W."""
    _check("zb-h2", pp, m)
    limit = 2 * pp - 1
    nxt_f, nxt_i = [0] * pp, [0] * pp
    pending_w: list[list[int]] = [[] for _ in range(pp)]
    w_done = [0] * pp
    done_f = [[False] * m for _ in range(pp)]  # by stage: stage == rank here
    done_i = [[False] * m for _ in range(pp)]
    rows: list[list[Step]] = [[] for _ in range(pp)]
    left = 3 * pp * m
    while left:
        ran = []
        for r in range(pp):
            fi, ii = nxt_f[r], nxt_i[r]
            if ii < fi and (r == pp - 1 or done_i[r + 1][ii]):
                ran.append(Step(r, "I", ii))
            elif fi < m and (r == 0 or done_f[r - 1][fi]) and fi - w_done[r] < limit:
                ran.append(Step(r, "F", fi))
            elif pending_w[r]:
                ran.append(Step(r, "W", pending_w[r][0]))
        if not ran:  # a guard: every (pp, m) tried completes (tests validate them)
            raise RuntimeError(f"zb-h2 generator stalled for pp={pp}, m={m}")
        for st in ran:  # finish the whole time step together
            r = st.stage
            rows[r].append(st)
            left -= 1
            if st.kind == "F":
                done_f[r][st.mb] = True
                nxt_f[r] += 1
            elif st.kind == "I":
                done_i[r][st.mb] = True
                nxt_i[r] += 1
                pending_w[r].append(st.mb)
            else:
                pending_w[r].pop(0)
                w_done[r] += 1
    return Schedule("zb-h2", pp, 1, m, tuple(tuple(row) for row in rows))


def repeated(schedule: Schedule, calls: int) -> Schedule:
    """``schedule`` run ``calls`` times one after another, call c's micro-batches numbered
    from c·m: what a framework that calls torch pipelining's ``schedule.step`` once per
    accumulation step runs (NeMo AutoModel, ``ParallelPlan.sharding.pp_sync_window``), each
    call with its own fill and drain."""
    m = schedule.num_microbatches
    rows = tuple(tuple(Step(st.stage, st.kind, st.mb + c * m) for c in range(calls) for st in row)
                 for row in schedule.ranks)
    return Schedule(schedule.name, schedule.pp, schedule.vpp, m * calls, rows)


def build_schedule(name: str, pp: int, num_microbatches: int, vpp: int = 1) -> Schedule:
    """The named schedule (one of ``SCHEDULES``) for ``pp`` ranks and ``num_microbatches``."""
    if name not in SCHEDULES:
        raise InputError(f"schedule: got {name!r}; allowed: {', '.join(SCHEDULES)} (or a CSV file)")
    if name == "interleaved":
        return interleaved(pp, vpp, num_microbatches)
    if name == "looped-bfs":
        return looped_bfs(pp, vpp, num_microbatches)
    if vpp != 1:
        raise InputError(f"schedule {name}: vpp: got {vpp!r}; only 'interleaved' and 'looped-bfs' run more than one "
                         "chunk per rank")
    return {"gpipe": gpipe, "1f1b": one_f_one_b, "zb-h1": zb_h1, "zb-h2": zb_h2}[name](pp, num_microbatches)
