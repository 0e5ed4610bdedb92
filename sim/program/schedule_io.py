"""Checking, drawing, saving and loading pipeline schedules.

``validate`` rejects a schedule that cannot run: a (stage, micro-batch) whose forward or
backward is missing or repeated, a step on a rank that does not hold its stage, a
backward given both as B and as I/W, a stage or micro-batch out of range, or an order
that deadlocks. Whether an order deadlocks does not depend on how long steps take, so
it is found by running the schedule with unit-time steps: at each time step every rank
runs its next step if that step's dependencies (``step_deps``) finished in an earlier
time step. If some rank can never go on, the message's first line names the stuck
ranks, the steps they wait at and what those wait for; below it is the step x rank
grid (rows: time steps, columns: ranks, cells: steps or ``.`` for idle) ending in a
``stuck`` row with the blocked steps marked ``>1B0<``, the way PyTorch pipelining's
validator prints it, so a user sees where it jams.

The CSV form is PyTorch pipelining's ``_dump_csv`` compute-only layout: one row per
pipeline rank, its steps' text forms separated by commas. An empty cell (PyTorch's
idle slot) is skipped, lines starting with ``#`` are comments; pp is the number of
rows, vpp and m are read off the highest stage and micro-batch. ``from_csv(to_csv(s),
s.name) == s`` for every schedule. Errors name the line and the cell.
"""

from __future__ import annotations

from pathlib import Path

from sim.errors import InputError
from sim.program.schedules import KINDS, Schedule, Step, step_deps

_MAX_ROWS = 24
_MAX_LISTED = 4


# ---------------------------------------------------------------------- unit-time run
def _unit_run(schedule: Schedule):
    """Rows of the unit-time run (one tuple of Step-or-None per time step) and, per rank
    that cannot finish, the step it is stuck at."""
    pos = [0] * schedule.pp
    done_at: dict[Step, int] = {}
    rows: list[tuple] = []
    t = 0
    while True:
        row = []
        for r, steps in enumerate(schedule.ranks):
            st = steps[pos[r]] if pos[r] < len(steps) else None
            if st is not None and not all(done_at.get(d, t) < t for d in step_deps(st, schedule)):
                st = None
            row.append(st)
        if not any(row):
            break
        for r, st in enumerate(row):
            if st is not None:
                done_at.setdefault(st, t)
                pos[r] += 1
        rows.append(tuple(row))
        t += 1
    stuck = {r: steps[pos[r]] for r, steps in enumerate(schedule.ranks) if pos[r] < len(steps)}
    return rows, stuck, done_at


def _grid(schedule: Schedule, rows, marks=frozenset(), stuck=None, max_rows: int | None = _MAX_ROWS) -> str:
    """Step x rank grid; cells in ``marks`` ((rank, Step) pairs) and the stuck row marked."""
    stuck = stuck or {}

    def cell(r, st):
        if st is None:
            return "."
        return f">{st}<" if (r, st) in marks else str(st)

    table = [[cell(r, st) for r, st in enumerate(row)] for row in rows]
    labels = [str(t) for t in range(len(rows))]
    lo, hi = 0, len(rows)
    if max_rows is not None and len(rows) > max_rows:
        marked = [t for t, row in enumerate(rows) if any((r, st) in marks for r, st in enumerate(row))]
        if stuck or not marked:
            lo = len(rows) - max_rows
        else:
            lo = max(0, min(marked[0] - max_rows // 3, len(rows) - max_rows))
        hi = lo + max_rows
    table, labels = table[lo:hi], labels[lo:hi]
    if stuck:
        table.append([f">{stuck[r]}<" if r in stuck else "." for r in range(schedule.pp)])
        labels.append("stuck")
    head = [f"rank {r}" for r in range(schedule.pp)]
    widths = [max([len(head[r])] + [len(row[r]) for row in table]) for r in range(schedule.pp)]
    lw = max([4] + [len(x) for x in labels])
    out = ["time".rjust(lw) + " | " + " | ".join(h.ljust(w) for h, w in zip(head, widths))]
    if lo:
        out.append(f"{'':>{lw}}   ... {lo} earlier time step(s) not shown")
    out += [lab.rjust(lw) + " | " + " | ".join(c.ljust(w) for c, w in zip(row, widths)) for lab, row in zip(labels, table)]
    if hi < len(rows):
        out.append(f"{'':>{lw}}   ... {len(rows) - hi} later time step(s) not shown")
    return "\n".join(line.rstrip() for line in out)


def render(schedule: Schedule, max_rows: int | None = None) -> str:
    """The schedule as it runs with unit-time steps, as a step x rank grid."""
    rows, stuck, _ = _unit_run(schedule)
    return _grid(schedule, rows, stuck=stuck, max_rows=max_rows)


# ---------------------------------------------------------------------- validate
def _where(schedule: Schedule, st: Step) -> str:
    return f"rank {schedule.owner(st.stage)}"


def _structure(schedule: Schedule) -> tuple[list[str], set]:
    """Problems that need no run: out-of-range, wrong rank, repeated, missing, mixed."""
    S, m = schedule.num_stages, schedule.num_microbatches
    problems: list[str] = []
    marks: set = set()
    seen: dict[Step, int] = {}
    for r, steps in enumerate(schedule.ranks):
        for st in steps:
            if st.stage >= S or st.mb >= m:
                what = f"stage {st.stage} is not in 0..{S - 1}" if st.stage >= S else f"micro-batch {st.mb} is not in 0..{m - 1}"
                problems.append(f"{st} on rank {r}: {what} (pp={schedule.pp}, vpp={schedule.vpp}, m={m})")
                marks.add((r, st))
            elif schedule.owner(st.stage) != r:
                problems.append(f"{st} is on rank {r} but stage {st.stage} belongs to rank {schedule.owner(st.stage)}")
                marks.add((r, st))
            if st in seen:
                where = f"on rank {r}" if seen[st] == r else f"on ranks {seen[st]} and {r}"
                problems.append(f"{st} appears twice, {where}")
                marks.add((r, st))
            seen.setdefault(st, r)
    for s in range(S):
        for j in range(m):
            has = {k: Step(s, k, j) in seen for k in KINDS}
            if not has["F"]:
                problems.append(f"{Step(s, 'F', j)} is missing ({_where(schedule, Step(s, 'F', j))})")
            if has["B"] and (has["I"] or has["W"]):
                split = Step(s, "I" if has["I"] else "W", j)
                problems.append(f"{Step(s, 'B', j)} and {split} both given: a backward is either B or I + W")
                marks.update((seen[x], x) for x in (Step(s, "B", j), split))
            elif not has["B"]:
                if not has["I"] and not has["W"]:
                    problems.append(f"the backward of stage {s}, micro-batch {j} is missing (no {Step(s, 'B', j)}, nor {Step(s, 'I', j)} + {Step(s, 'W', j)})")
                elif not has["I"] or not has["W"]:
                    lack = Step(s, "W" if has["I"] else "I", j)
                    problems.append(f"{lack} is missing ({_where(schedule, lack)})")
    return problems, marks


def _listed(items: list[str]) -> str:
    more = f"; and {len(items) - _MAX_LISTED} more" if len(items) > _MAX_LISTED else ""
    return "; ".join(items[:_MAX_LISTED]) + more


def validate(schedule: Schedule) -> None:
    """Raise ``InputError`` unless ``schedule`` can run to the end.

    The first line of the message says what is wrong, naming ranks and steps; for an
    order that jams (and for any other problem) the step x rank grid follows.
    """
    problems, marks = _structure(schedule)
    rows, stuck, done_at = _unit_run(schedule)
    if not problems and not stuck:
        return
    head = f"schedule {schedule.name} (pp={schedule.pp}, vpp={schedule.vpp}, m={schedule.num_microbatches}): "
    if stuck:
        waits = []
        for r, st in sorted(stuck.items()):
            missing = [d for d in step_deps(st, schedule) if d not in done_at]
            why = ", ".join(
                f"{d} ({'not in the schedule' if d not in schedule.step_set else 'rank ' + str(schedule.owner(d.stage)) + ', never reached'})"
                for d in missing
            )
            waits.append(f"rank {r} waits at {st} for {why}")
        problems.append(f"deadlock after {len(rows)} time step(s): " + _listed(waits))
    raise InputError(head + _listed(problems) + "\n" + _grid(schedule, rows, marks, stuck))


# ---------------------------------------------------------------------- CSV
def to_csv(schedule: Schedule) -> str:
    """One row per pipeline rank, steps as text separated by commas, after a comment."""
    head = (
        f"# trainsim pipeline schedule {schedule.name}: pp={schedule.pp} vpp={schedule.vpp} "
        f"microbatches={schedule.num_microbatches}; one row per rank, cells <stage><F|B|I|W><micro-batch>\n"
    )
    return head + "".join(",".join(str(s) for s in row) + "\n" for row in schedule.ranks)


def from_csv(text: str, name: str = "custom") -> Schedule:
    """Parse ``to_csv``'s (and PyTorch's compute-only ``_dump_csv``) format."""
    rows: list[tuple[Step, ...]] = []
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        row = []
        for col, cell in enumerate(line.split(","), 1):
            cell = cell.strip()
            if not cell:
                continue
            try:
                row.append(Step.parse(cell))
            except InputError:
                raise InputError(
                    f"schedule CSV line {lineno}, cell {col}: got {cell!r}; expected <stage><kind><micro-batch> "
                    f"such as '2F0', kind one of {', '.join(KINDS)}"
                ) from None
        if not row:
            raise InputError(f"schedule CSV line {lineno}: rank {len(rows)} has no steps")
        rows.append(tuple(row))
    if not rows:
        raise InputError("schedule CSV: no rows; expected one row of steps per pipeline rank")
    pp = len(rows)
    stages = 1 + max(s.stage for row in rows for s in row)
    if stages % pp:
        raise InputError(
            f"schedule CSV: the highest stage is {stages - 1}, so {stages} stages, which is not a multiple "
            f"of the {pp} rows (one per pipeline rank)"
        )
    m = 1 + max(s.mb for row in rows for s in row)
    return Schedule(name, pp, stages // pp, m, tuple(rows))


def load_schedule_csv(path) -> Schedule:
    """Read, parse and ``validate`` a schedule CSV; errors start with the file name."""
    from sim.fileio import read_text

    p = Path(path)
    text = read_text(p, "schedule file")
    try:
        sched = from_csv(text, name=p.stem)
        validate(sched)
    except InputError as e:
        raise InputError(f"{p}: {e}") from None
    return sched
