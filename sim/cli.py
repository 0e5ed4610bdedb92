"""The ``trainsim`` command line.

Each subcommand lives in its own module under ``sim.commands`` and exposes
``NAME``, ``HELP``, ``add_arguments(parser)`` and ``run(args) -> int``. This module only
wires them together and turns user errors into one line on stderr with exit code 2.
"""

from __future__ import annotations

import argparse
import difflib
import importlib
import re
import sys

from sim.errors import DeadlockError, InputError
from sim.gc_tuning import tuned
from sim.inputs.flags import did_you_mean

# Subcommand modules, in the order ``trainsim --help`` lists them.
COMMANDS = ["run", "compare", "estimate", "explain", "search", "sweep", "collective", "demo", "calibrate", "validate", "fit",
            "import_nccl_tests", "import_trace", "replay", "goodput"]


class _Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line (no usage dump) and exit code 2: a bad
    value is an ``argparse.ArgumentError`` (``exit_on_error=False``) naming the flag, and
    whatever else argparse refuses (an unknown flag, a missing value) comes to ``error``.
    Flags are never abbreviated (``allow_abbrev=False``): ``--tensor-model 2`` is an error,
    not ``--tensor-model-parallel-size``."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **{"allow_abbrev": False, "exit_on_error": False, **kwargs})

    def error(self, message: str):  # noqa: D401 - argparse API
        raise InputError(" ".join(message.split()))

    def parse_args(self, args=None, namespace=None):
        """As argparse's, but a flag no parser knows gets argparse-style "did you mean" (the
        closest flag of the command it was typed after): ``allow_abbrev=False`` turns
        prefixes into unknown flags, and argparse itself suggests nothing for those, while an
        experiment file's unknown keys get a suggestion (``sim.inputs.experiment``)."""
        ns, extras = self.parse_known_args(args, namespace)
        if extras:
            raise InputError(f"unrecognized arguments: {' '.join(extras)}{did_you_mean(extras, self._flags_of(ns))}")
        return ns

    def _flags_of(self, ns) -> list[str]:
        """The flags of this parser and of the subcommand ``ns`` ran."""
        flags = [o for a in self._actions for o in a.option_strings]
        for a in self._actions:
            if isinstance(a, argparse._SubParsersAction) and getattr(ns, a.dest, None) in a.choices:
                flags += [o for b in a.choices[getattr(ns, a.dest)]._actions for o in b.option_strings]
        return flags


def named_for_command_line(exc: InputError) -> InputError:
    """An error about a setting, naming it by its flag (``plan: tp`` is
    ``--tensor-model-parallel-size``); others (and those an experiment file's line names
    already) as they are."""
    from sim.inputs.schema import setting_field

    if exc.path is not None:  # named already, where a file wrote it
        return exc
    f = setting_field(exc.setting) if exc.setting is not None and exc.allowed is not None else None
    return exc.renamed(f.flag) if f is not None else exc


def build_parser() -> argparse.ArgumentParser:
    # allow_abbrev=False on every parser (subparsers do not inherit it): with flags this
    # alike, a prefix such as --tensor-model would silently set whichever flag it begins.
    parser = _Parser(
        prog="trainsim",
        description="Discrete-event simulator of LLM training on GPU clusters.",
        allow_abbrev=False,
    )
    from sim import __version__

    parser.add_argument("--version", action="version", version=f"trainsim {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for name in COMMANDS:
        mod = importlib.import_module(f"sim.commands.{name}")
        p = sub.add_parser(mod.NAME, help=mod.HELP, description=mod.HELP, allow_abbrev=False, exit_on_error=False)
        mod.add_arguments(p)
        p.set_defaults(_run=mod.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    from sim.workers import sigterm_as_interrupt

    # SIGTERM (a time limit, ``kill``) stops a command as Ctrl-C does: its worker pools end,
    # what finished is kept, and a search prints its best so far (sim.workers)
    with sigterm_as_interrupt():
        return _main(argv)


def _main(argv: list[str] | None) -> int:
    from sim.workers import Terminated

    parser = build_parser()
    try:
        argv = list(sys.argv[1:] if argv is None else argv)
        args = parser.parse_args(argv)
        if not getattr(args, "_run", None):
            parser.print_help()
            return 2
        # The collector paused around each simulation (sim.gc_tuning: the process is ours).
        # What is alive at the end stays frozen: the process ends next, and its last
        # collection would walk it all again (0.2 s of a 1.5 s run).
        with tuned(unfreeze_on_exit=False):
            return int(args._run(args) or 0)
    except argparse.ArgumentError as exc:  # a flag's value its type refused: what it allows
        hint = ""
        if exc.argument_name and exc.argument_name.startswith("--") and exc.message == "expected one argument":
            hint = f" (a value that starts with '-' is written {exc.argument_name}=-VALUE)"
        choice = re.match(r"invalid choice: '([^']*)' \(choose from (.*)\)$", exc.message)
        if choice:  # a misspelled command or choice: the closest, as argparse 3.14 does
            close = difflib.get_close_matches(choice[1], re.findall(r"'([^']*)'", choice[2]), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
        print(f"trainsim: error: {exc.argument_name}: {exc.message}{hint}", file=sys.stderr)
        return 2
    except InputError as exc:
        print(f"trainsim: error: {named_for_command_line(exc)}", file=sys.stderr)
        return 2
    except DeadlockError as exc:
        print(f"trainsim: error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # output piped into head & co.
        sys.stderr.close()
        return 0
    except OSError as exc:  # a file problem no check foresaw: still one line, never a traceback
        where = f"{exc.filename}: " if exc.filename else ""
        print(f"trainsim: error: {where}{exc.strerror or exc}", file=sys.stderr)
        return 2
    except Terminated:
        print("trainsim: terminated (SIGTERM)", file=sys.stderr)
        return 143
    except KeyboardInterrupt:
        print("trainsim: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
