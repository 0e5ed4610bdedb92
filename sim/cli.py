"""The ``trainsim`` command line.

Each subcommand lives in its own module under ``sim.commands`` and exposes
``NAME``, ``HELP``, ``add_arguments(parser)`` and ``run(args) -> int``. This module only
wires them together and turns user errors into one line on stderr with exit code 2.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from sim.errors import NEGATIVE_VALUE, DeadlockError, InputError, from_argparse

# Subcommand modules, in the order ``trainsim --help`` lists them.
COMMANDS = ["run", "compare", "estimate", "explain", "search", "sweep", "collective", "demo", "calibrate", "validate", "fit",
            "import_nccl_tests", "import_trace", "goodput"]


class _Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line (no usage dump) and exit code 2.

    A value that starts with '-' and a digit (``--size -1MiB``, ``--zero3-max-live-parameters
    -1e9``) or is ``-inf``/``-nan`` is taken as the flag's value, so its range check names
    it, instead of argparse calling it an unknown flag."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._negative_number_matcher = NEGATIVE_VALUE

    def error(self, message: str):  # noqa: D401 - argparse API
        raise from_argparse(message)


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
        p = sub.add_parser(mod.NAME, help=mod.HELP, description=mod.HELP, allow_abbrev=False)
        mod.add_arguments(p)
        p.set_defaults(_run=mod.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    try:
        argv = list(sys.argv[1:] if argv is None else argv)
        args = parser.parse_args(argv)
        if not getattr(args, "_run", None):
            parser.print_help()
            return 2
        return int(args._run(args) or 0)
    except (InputError, DeadlockError) as exc:
        print(f"trainsim: error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # output piped into head & co.
        sys.stderr.close()
        return 0
    except OSError as exc:  # a file problem no check foresaw: still one line, never a traceback
        where = f"{exc.filename}: " if exc.filename else ""
        print(f"trainsim: error: {where}{exc.strerror or exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("trainsim: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
