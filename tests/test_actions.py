"""Actions (``sim.program.actions``): the unchecked builders passes use (``Action.new``,
``Action.evolve``, ``with_peer``) make exactly the action the checked constructor makes
from the same values, every field included; and no module generates code at run time."""

import re
from dataclasses import fields
from pathlib import Path

import pytest

from sim.errors import InputError
from sim.program.actions import Action, with_peer

ROOT = Path(__file__).resolve().parent.parent

# A value for every field, none of them its default (so a builder that drops or
# defaults a field gives an action that compares unequal).
EVERY_FIELD = dict(name="ag 3", kind="collective", stream="side", duration_s=2e-3, flops=5.0, nbytes=1024,
                   peer=7, group=(0, 1, 2), op="allgather", algo="tree", protocol="ll128", channels=4, tag="t1",
                   category="zero", layer=12, mem=(("start", "params", 1024.0),), deps=("w 2", (1, "w 3")),
                   transport="direct", slows_compute=False)


def test_the_values_above_set_every_field_off_its_default():
    declared = {f.name: f.default for f in fields(Action)}
    assert set(EVERY_FIELD) == set(declared)
    assert all(EVERY_FIELD[k] != d for k, d in declared.items())


def test_new_evolve_and_with_peer_equal_the_checked_constructor():
    checked = Action(**EVERY_FIELD)
    built = Action.new(**EVERY_FIELD)
    assert type(built) is Action and built == checked and hash(built) == hash(checked)
    assert all(getattr(built, f.name) == EVERY_FIELD[f.name] for f in fields(Action))

    moved = with_peer(checked, 3)
    assert type(moved) is Action and moved == Action(**{**EVERY_FIELD, "peer": 3}) and moved is not checked
    assert checked.peer == 7  # the original is left as it was

    changed = checked.evolve(nbytes=4096, deps=("x",), name="ag 4")
    assert changed == Action(**{**EVERY_FIELD, "nbytes": 4096, "deps": ("x",), "name": "ag 4"})
    assert checked == Action(**EVERY_FIELD)
    assert checked.evolve() == checked and checked.evolve() is not checked


def test_new_defaults_as_the_checked_constructor_does():
    for kind, extra in [("compute", {}), ("comm", {}), ("send", {"peer": 1}), ("recv", {"peer": 0}),
                        ("copy", {"op": "d2h"}), ("collective", {"op": "allreduce", "group": (0, 1)})]:
        assert Action.new("a", kind=kind, **extra) == Action("a", kind=kind, **extra)
    assert Action.new("a").stream == "compute" and Action.new("s", kind="send", peer=1).stream == "comm"
    assert Action.new("a", stream="pcie").stream == "pcie"


def test_unknown_fields_are_refused():
    a = Action("a")
    with pytest.raises(TypeError):
        Action.new("a", colour="red")
    with pytest.raises(AttributeError):
        a.evolve(colour="red")
    with pytest.raises(TypeError):
        Action("a", colour="red")


def test_the_checked_constructor_normalises_and_checks():
    a = Action("c", kind="collective", op="allreduce", group=[1, 0], deps=["x", [2, "y"]])
    assert a.group == (1, 0) and a.deps == ("x", (2, "y")) and a.stream == "comm"
    with pytest.raises(InputError, match="nbytes"):
        Action("a", nbytes=float("inf"))
    assert (a.transport, a.slows_compute) == ("nccl", True)  # (a collective's claim: an NCCL kernel's)
    with pytest.raises(InputError, match="transport: got 'pigeon'; allowed: nccl, direct"):
        Action("c", kind="collective", op="allreduce", group=(0, 1), transport="pigeon")


def test_no_module_generates_code_or_swaps_classes_at_run_time():
    pattern = re.compile(r"\b(exec|eval)\(|\.__class__\s*=[^=]")
    offenders = [f"{p.relative_to(ROOT)}:{n}" for p in sorted((ROOT / "sim").rglob("*.py"))
                 for n, line in enumerate(p.read_text().splitlines(), 1) if pattern.search(line.split("#", 1)[0])]
    assert not offenders, offenders
