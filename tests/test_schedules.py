"""Pipeline schedules: closed forms with free communication, hand-computed orders and
timelines, memory in flight, CSV round trips, and the validator's grid.

Closed forms checked (p ranks, m micro-batches, v chunks per rank):
GPipe / 1F1B (Huang et al. 2019; Narayanan et al. SC'21): (m + p - 1)(t_f + t_b),
bubble (p-1)/(m+p-1) of the total; interleaved: m(t_f + t_b) + (p-1)(t_f + t_b)/v;
Zero Bubble (Qi et al., ICLR 2024, Table 2): ZB-H1 (p-1)(T_F + T_B - T_W),
ZB-H2 (p-1)(T_F + T_B - 2T_W), where T_B is the input-gradient pass I.
"""

import itertools
import re

import pytest

from sim.engine.core import simulate
from sim.errors import InputError
from sim.program.schedule_io import _unit_run, from_csv, load_schedule_csv, render, to_csv, validate
from sim.program.schedules import (SCHEDULES, Schedule, Step, build_schedule, in_flight, interleaved, looped_bfs,
                                   one_f_one_b,
                                 step_deps, to_program, zb_h1)


def _times(tf, tb=None, ti=None, tw=None):
    return lambda st: {"F": tf, "B": tb, "I": ti, "W": tw}[st.kind]


def _run(schedule, duration, make_star):
    return simulate(to_program(schedule, duration), make_star([1.0] * schedule.pp))


def _window_bubbles(trace, pp):
    """Per rank: idle time between its own first start and last end (the ZB paper's count)."""
    out = []
    for r in range(pp):
        spans = trace.spans_of(r)
        busy = sum(s.end_s - s.start_s for s in spans)
        out.append(max(s.end_s for s in spans) - min(s.start_s for s in spans) - busy)
    return out


def _all_schedules():
    for p, m in [(1, 1), (1, 3), (2, 1), (2, 2), (2, 5), (3, 2), (3, 7), (4, 4), (4, 9), (5, 12), (8, 16)]:
        for name in ("gpipe", "1f1b", "zb-h1", "zb-h2"):
            yield build_schedule(name, p, m)
    for p, v, k in [(1, 2, 3), (2, 2, 1), (2, 3, 2), (3, 2, 3), (4, 2, 2), (4, 4, 3), (8, 3, 2)]:
        yield build_schedule("interleaved", p, k * p, vpp=v)
    for p, v, m in [(1, 2, 3), (2, 1, 3), (2, 2, 1), (2, 3, 5), (4, 2, 4), (4, 3, 9)]:
        yield build_schedule("looped-bfs", p, m, vpp=v)


ALL = list(_all_schedules())


# ---------------------------------------------------------------- steps and orders
def test_step_text_form_and_strict_parse():
    assert str(Step(2, "F", 0)) == "2F0" and str(Step(13, "W", 127)) == "13W127"
    assert Step.parse("2F0") == Step(2, "F", 0) and Step.parse("10I11") == Step(10, "I", 11)
    for bad in ["2X0", " 2F0", "2F0 ", "F0", "2F", "", "02F0", "2F01", "-1F0", "2f0"]:
        with pytest.raises(InputError, match="step " + repr(bad).replace("(", r"\(")):
            Step.parse(bad)
    with pytest.raises(InputError, match="kind"):
        Step(0, "X", 0)


def test_one_f_one_b_order_by_hand():
    # p = 3, m = 4: rank r runs p-1-r warm-up forwards, then 1F1B, then the cool-down.
    s = one_f_one_b(3, 4)
    assert [" ".join(map(str, row)) for row in s.ranks] == [
        "0F0 0F1 0F2 0B0 0F3 0B1 0B2 0B3",
        "1F0 1F1 1B0 1F2 1B1 1F3 1B2 1B3",
        "2F0 2B0 2F1 2B1 2F2 2B2 2F3 2B3",
    ]


def test_interleaved_order_matches_megatron_by_hand():
    # p = 2, v = 2, m = 4. Forward k: chunk (k % 4) // 2, micro-batch (k // 4) * 2 + k % 2;
    # warm-up (p-r-1)*2 + (v-1)*p = 4 on rank 0, 2 on rank 1; stage = chunk*p + rank.
    s = interleaved(2, 2, 4)
    assert [" ".join(map(str, row)) for row in s.ranks] == [
        "0F0 0F1 2F0 2F1 0F2 2B0 0F3 2B1 2F2 0B0 2F3 0B1 2B2 2B3 0B2 0B3",
        "1F0 1F1 3F0 3B0 3F1 3B1 1F2 1B0 1F3 1B1 3F2 3B2 3F3 3B3 1B2 1B3",
    ]
    assert s.owner(3) == 1 and s.num_stages == 4
    assert step_deps(Step(2, "F", 0), s) == (Step(1, "F", 0),)  # chunk boundary: rank 1 -> rank 0


def test_zb_h1_order_by_hand():
    # Rank r runs W(j - r) right after I(j) and its last r W passes at the end.
    s = zb_h1(2, 3)
    assert [" ".join(map(str, row)) for row in s.ranks] == [
        "0F0 0F1 0I0 0W0 0F2 0I1 0W1 0I2 0W2",
        "1F0 1I0 1F1 1I1 1W0 1F2 1I2 1W1 1W2",
    ]


def test_step_deps_use_I_when_the_next_stage_splits_its_backward():
    s = zb_h1(3, 2)
    assert step_deps(Step(0, "I", 1), s) == (Step(0, "F", 1), Step(1, "I", 1))
    assert step_deps(Step(2, "I", 1), s) == (Step(2, "F", 1),)  # last stage: only its forward
    assert step_deps(Step(1, "W", 0), s) == (Step(1, "I", 0),)
    assert step_deps(Step(0, "F", 0), s) == ()
    assert step_deps(Step(0, "B", 0), one_f_one_b(3, 2)) == (Step(0, "F", 0), Step(1, "B", 0))


def test_to_program_actions_carry_names_kinds_and_cross_rank_deps():
    prog = to_program(zb_h1(2, 1), _times(1.0, ti=2.0, tw=0.5))
    a = {(r, x.name): x for r, acts in prog.actions.items() for x in acts}
    assert [x.name for x in prog.actions[0]] == ["0F0", "0I0", "0W0"]
    assert a[(0, "0I0")].deps == ((0, "0F0"), (1, "1I0")) and a[(0, "0I0")].duration_s == 2.0
    assert a[(1, "1F0")].deps == ((0, "0F0"),) and a[(1, "1W0")].category == "W"
    assert all(x.kind == "compute" and x.stream == "compute" for x in a.values())


def test_every_schedule_validates_and_runs_each_pass_once():
    for s in ALL:
        validate(s)
        kinds = {"B"} if s.name in ("gpipe", "1f1b", "interleaved", "looped-bfs") else {"I", "W"}
        steps = [st for row in s.ranks for st in row]
        assert len(steps) == len(set(steps)) == s.num_stages * s.num_microbatches * (1 + len(kinds))
        assert {st.kind for st in steps} == {"F"} | kinds
        assert all(s.owner(st.stage) == r for r, row in enumerate(s.ranks) for st in row)


def test_unit_time_check_agrees_with_the_engine(make_star):
    # The validator's unit-time run is the engine's timeline with every step taking 1 s.
    for s in ALL:
        rows, stuck, _ = _unit_run(s)
        assert not stuck
        starts = {(r, str(st)): float(t) for t, row in enumerate(rows) for r, st in enumerate(row) if st}
        tr = _run(s, lambda st: 1.0, make_star)
        assert {(x.rank, x.name): x.start_s for x in tr.spans} == starts


# ---------------------------------------------------------------- closed forms
def test_exact_timeline_of_1f1b_on_two_ranks(make_star):
    tr = _run(one_f_one_b(2, 2), _times(1.0, 2.0), make_star)
    assert [(s.rank, s.name, s.start_s, s.end_s) for s in tr.spans] == [
        (0, "0F0", 0.0, 1.0), (0, "0F1", 1.0, 2.0), (0, "0B0", 4.0, 6.0), (0, "0B1", 7.0, 9.0),
        (1, "1F0", 1.0, 2.0), (1, "1B0", 2.0, 4.0), (1, "1F1", 4.0, 5.0), (1, "1B1", 5.0, 7.0),
    ]


@pytest.mark.parametrize("p,m", [(1, 1), (1, 4), (2, 1), (2, 4), (3, 7), (4, 4), (4, 8), (4, 16), (8, 8), (8, 32)])
@pytest.mark.parametrize("name", ["gpipe", "1f1b"])
def test_gpipe_and_1f1b_take_m_plus_p_minus_1_slots(make_star, name, p, m):
    tf, tb = 1.0, 2.0
    tr = _run(build_schedule(name, p, m), _times(tf, tb), make_star)
    assert tr.end_s == (m + p - 1) * (tf + tb)
    for r in range(p):
        busy = sum(s.duration_s for s in tr.spans_of(r))
        assert busy == m * (tf + tb)
        assert (tr.end_s - busy) / tr.end_s == pytest.approx((p - 1) / (m + p - 1), rel=1e-12)


@pytest.mark.parametrize("p,v,k", [(2, 2, 1), (2, 2, 4), (2, 4, 3), (3, 3, 2), (4, 2, 1), (4, 2, 4), (4, 4, 2), (8, 2, 2)])
def test_interleaving_shrinks_the_bubble_by_v(make_star, p, v, k):
    m, tf, tb = k * p, 1.0, 2.0
    tr = _run(interleaved(p, v, m), _times(tf / v, tb / v), make_star)  # each chunk holds 1/v of the layers
    assert tr.end_s == pytest.approx(m * (tf + tb) + (p - 1) * (tf + tb) / v, rel=1e-12)
    plain = _run(one_f_one_b(p, m), _times(tf, tb), make_star).end_s
    assert (tr.end_s - m * (tf + tb)) * v == pytest.approx(plain - m * (tf + tb), rel=1e-12)


@pytest.mark.parametrize("p,m", [(2, 3), (2, 8), (3, 5), (4, 7), (4, 12), (6, 11), (8, 24)])
def test_zero_bubble_closed_forms_on_a_uniform_model(make_star, p, m):
    # T_F = T_I = T_W = T. Table 2: 1F1B (p-1)(T_F+T_B+T_W) = 3(p-1)T, ZB-H1 (p-1)T, ZB-H2 0.
    # The bubble is counted per rank from its own first to its own last pass, as the paper
    # does (its Sec. 4 removes the optimizer barrier); ZB-H2 needs m >= 2p-1 to fill it.
    T = 1.0
    d = _times(T, 2 * T, T, T)
    assert max(_window_bubbles(_run(one_f_one_b(p, m), d, make_star), p)) == 3 * (p - 1) * T
    h1 = _run(build_schedule("zb-h1", p, m), d, make_star)
    h2 = _run(build_schedule("zb-h2", p, m), d, make_star)
    assert max(_window_bubbles(h1, p)) == (p - 1) * (T + T - T)
    assert max(_window_bubbles(h2, p)) == (p - 1) * (T + T - 2 * T) == 0
    # Both reach the lower bound on the makespan: the last rank waits (p-1)T_F, then is busy.
    assert h1.end_s == h2.end_s == (p - 1) * T + m * 3 * T


@pytest.mark.parametrize("tf,ti,tw", [(2.0, 2.0, 1.0), (1.0, 2.0, 1.0), (2.0, 1.0, 1.0), (1.0, 1.0, 0.5),
                                      (2.0, 3.0, 2.0), (3.0, 2.0, 2.0), (1.5, 2.0, 1.0)])
@pytest.mark.parametrize("p", [2, 4, 6])
def test_zero_bubble_closed_forms_hold_with_unequal_times_when_w_is_not_longest(make_star, p, tf, ti, tw):
    # The paper's forms hold exactly whenever T_W <= T_F (and, for ZB-H2, T_F + T_I >= 2T_W);
    # its Table 1 FLOPs give T_W <= T_F. ZB-H2's order was built for equal times yet holds.
    m = 3 * p
    d = _times(tf, ti + tw, ti, tw)
    assert max(_window_bubbles(_run(zb_h1(p, m), d, make_star), p)) == (p - 1) * (tf + ti - tw)
    assert max(_window_bubbles(_run(build_schedule("zb-h2", p, m), d, make_star), p)) == (p - 1) * (tf + ti - 2 * tw)


@pytest.mark.parametrize("tf,ti,tw", [(1.0, 1.0, 2.0), (1.0, 2.0, 2.0), (2.0, 2.0, 3.0)])
def test_zero_bubble_when_w_is_longer_than_f(make_star, tf, ti, tw):
    # Where the paper's forms do not hold: a W longer than F. The deferred W passes fill
    # gaps where 1F1B would run a forward, so a W longer than T_F overruns its gap and
    # saves only T_F: the bubble is (p-1)(T_F + T_I - min(T_W, T_F)) for ZB-H1 and
    # (p-1)max(0, T_F + T_I - 2 min(T_W, T_F)) for ZB-H2, never the paper's smaller (or
    # negative) figure.
    p, m = 4, 12
    d = _times(tf, ti + tw, ti, tw)
    h1 = max(_window_bubbles(_run(zb_h1(p, m), d, make_star), p))
    h2 = max(_window_bubbles(_run(build_schedule("zb-h2", p, m), d, make_star), p))
    assert h1 == (p - 1) * (tf + ti - min(tw, tf)) > (p - 1) * (tf + ti - tw)
    assert h2 == (p - 1) * max(0.0, tf + ti - 2 * min(tw, tf)) > (p - 1) * (tf + ti - 2 * tw)


def test_looped_bfs_order_matches_pytorch_by_hand():
    # torch.distributed.pipelining.ScheduleLoopedBFS: rank r's chunks r, r + p, ... each run every
    # micro-batch's forward; then the chunks in reverse, each chunk's micro-batches last first
    s = looped_bfs(2, 2, 3)
    assert str(s).splitlines() == ["0F0 0F1 0F2 2F0 2F1 2F2 2B2 2B1 2B0 0B2 0B1 0B0",
                                   "1F0 1F1 1F2 3F0 3F1 3F2 3B2 3B1 3B0 1B2 1B1 1B0"]


@pytest.mark.parametrize("p,v,k", [(2, 2, 1), (2, 2, 4), (2, 4, 3), (3, 3, 2), (4, 2, 1), (4, 2, 4), (4, 4, 2), (8, 2, 2)])
def test_looped_bfs_bubble_is_interleavings_when_m_is_at_least_p(make_star, p, v, k):
    """Breadth-first (Lamy-Poirier 2023): with m >= p a rank never waits between its chunks,
    so the fill and drain are p - 1 chunk passes each way, (p - 1)(t_f + t_b)/v, as interleaved
    1F1B's; derived by hand from the start times c·m + j + r (unit chunk passes)."""
    m, tf, tb = k * p, 1.0, 2.0
    tr = _run(looped_bfs(p, v, m), _times(tf / v, tb / v), make_star)  # each chunk holds 1/v of the layers
    assert tr.end_s == pytest.approx(m * (tf + tb) + (p - 1) * (tf + tb) / v, rel=1e-12)
    assert in_flight(looped_bfs(p, v, m)) == (m * v,) * p  # every forward before any backward: all of them


# ---------------------------------------------------------------- memory in flight
@pytest.mark.parametrize("p,m", [(1, 3), (2, 2), (3, 2), (3, 9), (4, 4), (4, 8), (6, 20), (8, 16)])
def test_micro_batches_in_flight(p, m):
    assert in_flight(build_schedule("gpipe", p, m))[0] == m
    f1 = in_flight(build_schedule("1f1b", p, m))
    assert max(f1) == f1[0] == min(p, m) and f1 == tuple(min(p - r, m) for r in range(p))
    assert max(in_flight(build_schedule("zb-h1", p, m))) == min(p, m)
    h2 = in_flight(build_schedule("zb-h2", p, m))
    assert max(h2) <= 2 * p - 1 and (m < 2 * p - 1 or h2[0] == 2 * p - 1)


@pytest.mark.parametrize("p,v", [(2, 2), (4, 2), (4, 3), (8, 4)])
def test_interleaved_first_rank_holds_korthikanti_factor(p, v):
    # Korthikanti et al. 2022: with interleaving the first stage holds p micro-batches'
    # activations times (1 + (p-1)/(p v)); one chunk-micro-batch is 1/v of that.
    chunks = in_flight(interleaved(p, v, 4 * p))[0]
    assert chunks / v == pytest.approx(p * (1 + (p - 1) / (p * v)), rel=1e-12)


# ---------------------------------------------------------------- CSV
def test_csv_round_trip_is_exact_for_every_schedule():
    for s in ALL:
        text = to_csv(s)
        back = from_csv(text, name=s.name)
        assert back == s and to_csv(back) == text
        assert len([ln for ln in text.splitlines() if not ln.startswith("#")]) == s.pp


def test_csv_reads_pytorch_layout_with_idle_cells_and_comments():
    text = "# from PyTorch _dump_csv\n0F0,,0F1,0B0, 0B1\n\n,1F0,1B0,1F1,1B1,\n"
    s = from_csv(text)
    assert (s.name, s.pp, s.vpp, s.num_microbatches) == ("custom", 2, 1, 2)
    assert s.ranks[1] == (Step(1, "F", 0), Step(1, "B", 0), Step(1, "F", 1), Step(1, "B", 1))
    validate(s)


def test_csv_errors_name_line_and_cell(tmp_path):
    with pytest.raises(InputError, match=r"line 3, cell 2: got '1X0'"):
        from_csv("# header\n0F0,0B0\n1F0,1X0\n")
    with pytest.raises(InputError, match="no rows"):
        from_csv("# only a comment\n")
    with pytest.raises(InputError, match="highest stage is 2, so 3 stages, which is not a multiple of the 2 rows"):
        from_csv("0F0,0B0\n1F0,2F0\n")
    with pytest.raises(InputError, match="cannot read"):
        load_schedule_csv(tmp_path / "nope.csv")


def test_load_schedule_csv_validates_and_names_the_file(tmp_path):
    good = tmp_path / "mine.csv"
    good.write_text(to_csv(build_schedule("zb-h2", 3, 6)))
    s = load_schedule_csv(good)
    assert s.name == "mine" and s.ranks == build_schedule("zb-h2", 3, 6).ranks
    bad = tmp_path / "bad.csv"
    bad.write_text("0F0,0B0,0F1,0B1\n1F0,1F1,1B0,1B1\n")
    with pytest.raises(InputError) as e:
        load_schedule_csv(bad)
    assert str(e.value).startswith(f"{bad}: schedule bad (pp=2, vpp=1, m=2): deadlock")
    assert ">0B0<" in str(e.value)


# ---------------------------------------------------------------- broken schedules
def _broken(rows, name="broken"):
    rows = [[Step.parse(x) for x in row.split()] for row in rows]
    m = 1 + max(s.mb for row in rows for s in row)
    return Schedule(name, len(rows), 1, m, tuple(map(tuple, rows)))


def _error(schedule):
    with pytest.raises(InputError) as e:
        validate(schedule)
    return str(e.value)


def test_cross_rank_deadlock_prints_the_grid_by_hand():
    # Rank 0 runs 0B0 before 0F1, rank 1 runs 1F1 before 1B0: each waits on the other.
    msg = _error(_broken(["0F0 0B0 0F1 0B1", "1F0 1F1 1B0 1B1"]))
    assert msg == (
        "schedule broken (pp=2, vpp=1, m=2): deadlock after 2 time step(s): "
        "rank 0 waits at 0B0 for 1B0 (rank 1, never reached); rank 1 waits at 1F1 for 0F1 (rank 0, never reached)\n"
        " time | rank 0 | rank 1\n"
        "    0 | 0F0    | .\n"
        "    1 | .      | 1F0\n"
        "stuck | >0B0<  | >1F1<"
    )


def test_backward_before_its_forward_is_rejected():
    msg = _error(_broken(["0F0 0F1 0B0 0B1", "1B0 1F0 1F1 1B1"]))
    first, *grid = msg.split("\n")
    assert "rank 1 waits at 1B0 for 1F0" in first and "rank 0 waits at 0B0 for 1B0" in first
    assert grid[0].split() == ["time", "|", "rank", "0", "|", "rank", "1"] and grid[-1].split("|")[2].strip() == ">1B0<"


@pytest.mark.parametrize("rows,says", [
    (["0F0 0F1 0B0 0B1", "1F0 1B0 1B1"], "1F1 is missing (rank 1)"),
    (["0F0 0F1 0B0 0B1", "1F0 1B0 1F1"], "the backward of stage 1, micro-batch 1 is missing"),
    (["0F0 1F1 0F1 0B0 0B1", "1F0 1B0 1F1 1B1"], "1F1 is on rank 0 but stage 1 belongs to rank 1"),
    (["0F0 0F1 0B0 0B1 0B1", "1F0 1B0 1F1 1B1"], "0B1 appears twice, on rank 0"),
    (["0F0 0F1 0B0 0I1 0W1 0B1", "1F0 1B0 1F1 1B1"], "0B1 and 0I1 both given"),
    (["0F0 0F1 0I0 0W0 0I1", "1F0 1I0 1W0 1F1 1I1 1W1"], "0W1 is missing (rank 0)"),
])
def test_structural_problems_are_named_on_the_first_line(rows, says):
    msg = _error(_broken(rows))
    first = msg.split("\n")[0]
    assert first.startswith("schedule broken (pp=2, vpp=1, m=2): ") and says in first
    assert re.search(r"\n *time \| rank 0 \| rank 1\n", msg)


def test_out_of_range_and_marked_cells():
    s = Schedule("x", 2, 1, 1, ((Step(0, "F", 0), Step(0, "F", 5), Step(0, "B", 0)), (Step(1, "F", 0), Step(1, "B", 0))))
    msg = _error(s)
    assert "0F5 on rank 0: micro-batch 5 is not in 0..0" in msg.split("\n")[0] and ">0F5<" in msg


def test_big_grids_are_cut_to_the_jam():
    rows = [list(r) for r in build_schedule("1f1b", 4, 32).ranks]
    rows[3].remove(Step(3, "F", 30))
    msg = _error(Schedule("cut", 4, 1, 32, tuple(map(tuple, rows))))
    lines = msg.split("\n")
    assert "3F30 is missing (rank 3)" in lines[0] and "rank 3 waits at 3B30 for 3F30 (not in the schedule)" in lines[0]
    assert "earlier time step(s) not shown" in lines[2] and len(lines) == 2 + 1 + 24 + 1
    assert lines[-1].startswith("stuck") and ">3B30<" in lines[-1]


# ---------------------------------------------------------------- build and misc
def test_build_schedule_rejects_bad_names_and_combinations():
    for args, says in [
        (("zb-v", 2, 4), "allowed: gpipe, 1f1b, interleaved, zb-h1, zb-h2"),
        (("interleaved", 2, 4), "interleaving needs vpp >= 2"),
        (("interleaved", 4, 6, 2), "got 6; must be a multiple of pp = 4"),
        (("1f1b", 2, 4, 2), "only 'interleaved'"),
        (("gpipe", 0, 4), "pp: got 0"),
        (("zb-h1", 2, 0), "num_microbatches: got 0"),
    ]:
        with pytest.raises(InputError, match=says):
            build_schedule(*args)
    assert set(SCHEDULES) == {"gpipe", "1f1b", "interleaved", "zb-h1", "zb-h2", "looped-bfs"}


def test_schedules_are_deterministic_hashable_data():
    for name, (p, m) in itertools.product(("gpipe", "1f1b", "zb-h1", "zb-h2"), [(3, 5), (4, 8)]):
        a, b = build_schedule(name, p, m), build_schedule(name, p, m)
        assert a == b and hash(a) == hash(b)
    assert build_schedule("interleaved", 2, 4, 2) == interleaved(2, 2, 4)


def test_render_shows_the_unit_time_grid():
    assert render(one_f_one_b(2, 2)) == (
        "time | rank 0 | rank 1\n"
        "   0 | 0F0    | .\n"
        "   1 | 0F1    | 1F0\n"
        "   2 | .      | 1B0\n"
        "   3 | 0B0    | 1F1\n"
        "   4 | .      | 1B1\n"
        "   5 | 0B1    | ."
    )
