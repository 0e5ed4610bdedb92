"""Regenerate the command outputs quoted in README.md and docs/*.md, or check them.

Every output the documents quote is produced by running its command. A quoted output is
a *marked block*: an HTML comment naming the command, then a fenced block holding what it
prints. The comment is invisible on GitHub; the fenced block is rewritten by this script.

    <!-- run: trainsim compare experiments/schedules.toml -->
    ```
    $ trainsim compare experiments/schedules.toml
    llama2-7b: 6.74B params, ...
    ```

The first line of the block is the command itself (``$ ...``, wrapped at 100 columns with
``\\``), so the command shown is the command run. Options follow the command, one per line,
inside the comment:

    exit: 2                the exit status the command must end with (default 0); a
                           non-zero status quotes stderr after stdout
    mask: REGEX            volatile text (wall-clock times): each match of REGEX (its first
                           group, if it has one) is written as ``…``; ``^`` and ``$`` match
                           at each line
    lines: 1-8, 12, 20-    keep only these lines of the output (1-based; ``20-`` to the
                           end); each gap is written as a line ``...``
    fence: toml            the language of the output fence (default none)
    show: output           quote the output only, without the ``$`` line
    slow                   regenerated and checked by this script, skipped by the test
                           (tests/test_docs.py runs every other block)
    image: SRC -> DEST     after the run, copy the file SRC (written by the command) to
                           DEST (a picture under docs/img/); --check compares the bytes

A block of commands that is not run (it needs a GPU, a file of the reader's, a package
trainsim does not install, or it is a usage synopsis) says so, and why, right before it:

    <!-- not run: needs a GPU and PyTorch -->
    ```sh
    trainsim calibrate ...
    ```

Every other fenced block that holds a command (a line starting ``trainsim``, ``python``,
``make``, ``pip`` or ``$``) or Python code must be a marked block (``unmarked_blocks``;
tests/test_docs.py fails on one).

A table of contents is marked ``<!-- toc -->``: the bullet list right after it is rewritten
from the page's ``##`` and ``###`` headings below it, linked by GitHub's anchors.

A Python example is marked ``<!-- run: python -->`` right before a ```python block: the
block runs as a script, and the next fenced block after it (a line of prose such as
"prints:" may come between) is its output.

Commands run in the repository root, one at a time, with no shell: ``trainsim`` is this
Python's ``-m sim`` and ``python`` this Python, with the repository first on the path,
PYTHONHASHSEED=0, TZ=UTC, COLUMNS=100 and TRAINSIM_DEBUG unset (debug mode checks
invariants and never changes an output; it only costs time). Output is what the command
prints on stdout (stderr is left out: progress lines go there), lines stripped of trailing
blanks, the repository's absolute path written as ``.``. Same inputs, same files.

    python experiments/regen_docs.py            # rewrite every marked block
    python experiments/regen_docs.py --check    # report drift, write nothing (exit 1 on drift)
    python experiments/regen_docs.py --quick    # skip the blocks marked slow
    python experiments/regen_docs.py docs/search.md   # only these files
"""

from __future__ import annotations

import argparse
import difflib
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MASK = "…"
WIDTH = 100
OPTIONS = ("exit", "mask", "lines", "fence", "show", "slow", "image")
MARKER = re.compile(r"^<!-- run:(.*)$")
NOT_RUN = re.compile(r"^<!-- not run:(.*?)-->\s*$")
COMMAND = re.compile(r"^\s*(\$ |trainsim( |$)|python3? |make |pip )")
FENCE = re.compile(r"^(```+)(\S*)\s*$")


class MarkerError(ValueError):
    """A marked block that cannot be read: names the file, the line and what is wrong."""


@dataclass
class Block:
    path: Path
    line: int                    # 1-based line of the marker
    command: str                 # "python" for a Python example
    options: dict = field(default_factory=dict)
    code: str = ""               # a Python example's source
    start: int = 0               # index of the output fence's opening line
    end: int = 0                 # index of its closing line
    quoted: str = ""             # the output block's text now

    @property
    def where(self) -> str:
        return f"{_rel(self.path)}:{self.line}"

    @property
    def slow(self) -> bool:
        return "slow" in self.options


def _rel(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(ROOT))
    except ValueError:
        return str(path)


def _fence_end(lines: list[str], i: int, ticks: str, where: str) -> int:
    for j in range(i + 1, len(lines)):
        if lines[j].rstrip() == ticks:
            return j
    raise MarkerError(f"{where}: the fenced block opened on line {i + 1} is never closed")


def _options(raw: list[str], where: str) -> dict:
    opts: dict = {}
    for text in raw:
        key, _, value = text.strip().partition(":")
        key, value = key.strip(), value.strip()
        if key not in OPTIONS:
            raise MarkerError(f"{where}: unknown option {text.strip()!r}; allowed: {', '.join(OPTIONS)}")
        if key == "mask":
            try:
                re.compile(value)
            except re.error as exc:
                raise MarkerError(f"{where}: mask: {value!r} is not a regular expression ({exc})") from None
            opts.setdefault("mask", []).append(value)
        elif key == "show" and value != "output":
            raise MarkerError(f"{where}: show: got {value!r}; allowed: output")
        elif key == "exit" and not value.isdigit():
            raise MarkerError(f"{where}: exit: got {value!r}; expected an exit status (0-255)")
        else:
            opts[key] = value
    return opts


def find_blocks(path: Path, text: str | None = None) -> list[Block]:
    """Every marked block of a Markdown file (or of ``text``, its contents), in order."""
    lines = (path.read_text(encoding="utf-8") if text is None else text).split("\n")
    blocks, i = [], 0
    while i < len(lines):
        m = MARKER.match(lines[i])
        if not m:
            i += 1
            continue
        where = f"{_rel(path)}:{i + 1}"
        head, raw, j = m.group(1), [], i
        while "-->" not in lines[j]:
            j += 1
            if j == len(lines):
                raise MarkerError(f"{where}: the marker's comment is never closed with -->")
            raw.append(lines[j])
        if j == i:
            head = head.split("-->", 1)[0]
        else:
            raw[-1] = raw[-1].split("-->", 1)[0]
        raw = [r for r in raw if r.strip()]
        block = Block(path, i + 1, head.strip(), _options(raw, where))
        if not block.command:
            raise MarkerError(f"{where}: the marker names no command")
        k = j + 1
        while k < len(lines) and not lines[k].strip():
            k += 1
        if block.command == "python":
            f = FENCE.match(lines[k]) if k < len(lines) else None
            if not f or f.group(2) != "python":
                raise MarkerError(f"{where}: `run: python` must come right before a ```python block")
            e = _fence_end(lines, k, f.group(1), where)
            block.code = "\n".join(lines[k + 1:e]) + "\n"
            k, prose = e + 1, 0
            while k < len(lines) and not FENCE.match(lines[k]) and prose <= 2:
                prose += bool(lines[k].strip())
                k += 1
        f = FENCE.match(lines[k]) if k < len(lines) else None
        if not f:
            raise MarkerError(f"{where}: the marker is not followed by a fenced block for its output")
        block.start, block.end = k, _fence_end(lines, k, f.group(1), where)
        block.quoted = "\n".join(lines[k + 1:block.end])
        blocks.append(block)
        i = block.end + 1
    return blocks


def unmarked_blocks(path: Path) -> list[str]:
    """The fenced blocks of a page that hold commands or Python code but are neither a marked
    block (its command, its output or its Python example) nor marked ``<!-- not run: REASON -->``;
    one ``file:line: first line`` each. A ``not run`` marker without a reason is one too."""
    lines = path.read_text(encoding="utf-8").split("\n")
    covered: set[int] = set()
    for b in find_blocks(path):
        covered.update(range(b.line - 1, b.end + 1))
    out, i = [], 0
    while i < len(lines):
        f = FENCE.match(lines[i])
        if not f:
            i += 1
            continue
        end = _fence_end(lines, i, f.group(1), f"{_rel(path)}:{i + 1}")
        body = lines[i + 1:end]
        code = f.group(2) == "python" or any(COMMAND.match(x) for x in body)
        before = next((lines[k] for k in range(i - 1, -1, -1) if lines[k].strip()), "")
        m = NOT_RUN.match(before)
        if code and i not in covered and not (m and m.group(1).strip()):
            first = next((x.strip() for x in body if x.strip()), "")
            out.append(f"{_rel(path)}:{i + 1}: {first[:80]}")
        i = end + 1
    return out


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces as hyphens."""
    text = re.sub(r"[`*_]|\[([^\]]*)\]\([^)]*\)", lambda m: m.group(1) or "", heading.strip()).lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def headings(lines: list[str]) -> list[tuple[int, str, str]]:
    """(level, text, anchor) of every heading outside fenced blocks; repeated anchors get -1, -2..."""
    out, seen, fence = [], {}, None
    for text in lines:
        f = FENCE.match(text)
        if f and (fence is None or text.rstrip() == fence):
            fence = None if fence else f.group(1)
            continue
        m = re.match(r"^(#{1,6}) (.*)$", text) if fence is None else None
        if m:
            base = slug(m.group(2))
            n = seen.get(base, 0)
            seen[base] = n + 1
            out.append((len(m.group(1)), m.group(2).strip(), base if n == 0 else f"{base}-{n}"))
    return out


def with_toc(text: str) -> str:
    """The page with the list after its ``<!-- toc -->`` rewritten from its headings."""
    lines = text.split("\n")
    if "<!-- toc -->" not in lines:
        return text
    i = lines.index("<!-- toc -->")
    j = i + 1
    while j < len(lines) and not lines[j].strip():
        j += 1
    while j < len(lines) and (lines[j].lstrip().startswith("- ") or not lines[j].strip()):
        j += 1
    items = [f"{'  ' * (level - 2)}- [{title}](#{anchor})" for level, title, anchor in headings(lines[j:])
             if level in (2, 3)]
    return "\n".join([*lines[:i + 1], "", *items, "", *lines[j:]])


def _argv(command: str) -> list[str]:
    argv = shlex.split(command)
    if argv[0] == "trainsim":
        return [sys.executable, "-m", "sim", *argv[1:]]
    if argv[0] == "python":
        return [sys.executable, *argv[1:]]
    return argv


def _env() -> dict:
    env = {k: v for k, v in os.environ.items() if k != "TRAINSIM_DEBUG"}
    env.update(PYTHONPATH=os.pathsep.join([str(ROOT), *filter(None, [env.get("PYTHONPATH")])]),
               PYTHONHASHSEED="0", TZ="UTC", COLUMNS=str(WIDTH))
    return env


def wrap_command(command: str) -> str:
    """``$ command``, wrapped before a flag (with its value) past WIDTH columns."""
    units: list[str] = []
    for tok in shlex.split(command):
        quoted = shlex.quote(tok)
        if units and not tok.startswith("-") and units[-1].startswith("-") and " " not in units[-1]:
            units[-1] += " " + quoted
        else:
            units.append(quoted)
    out, line = [], "$"
    for u in units:
        if len(line) + 1 + len(u) > WIDTH - 2 and line.strip() not in ("$", ""):
            out.append(line + " \\")
            line = "   "
        line += " " + u
    out.append(line)
    return "\n".join(out)


def _keep(lines: list[str], spec: str, where: str) -> list[str]:
    keep: set[int] = set()
    for part in filter(None, (p.strip() for p in spec.split(","))):
        m = re.fullmatch(r"(\d+)(?:\s*-\s*(\d*))?", part)
        if not m:
            raise MarkerError(f"{where}: lines: {part!r} is not N, N-M or N-")
        a = int(m.group(1))
        b = a if m.group(2) is None else (int(m.group(2)) if m.group(2) else len(lines))
        keep.update(range(a, b + 1))
    out, gap = [], False
    for n, text in enumerate(lines, 1):
        if n in keep:
            out.append(text)
            gap = False
        elif not gap:
            out.append("...")
            gap = True
    return out


def format_output(block: Block, stdout: str) -> str:
    """The block's text from what the command printed: masks, kept lines, the ``$`` line."""
    text = stdout.replace(str(ROOT), ".")
    for rx in block.options.get("mask", []):
        pat = re.compile(rx, re.M)
        text = pat.sub(lambda m: m.group(0).replace(m.group(1), MASK) if pat.groups else MASK, text)
    lines = [t.rstrip() for t in text.split("\n")]
    while lines and not lines[-1]:
        lines.pop()
    if "lines" in block.options:
        lines = _keep(lines, block.options["lines"], block.where)
    if block.command != "python" and block.options.get("show") != "output":
        lines.insert(0, wrap_command(block.command))
    return "\n".join(lines)


_FORK_SERVER = r"""
import json, os, sys, traceback
sys.path.insert(0, os.getcwd())
import sim.cli
sim.cli.build_parser()  # (imports every command's module, once, before the forks)
for line in sys.stdin:
    argv, out, err = json.loads(line)
    pid = os.fork()
    if pid == 0:  # the command, in a fresh fork of this process: as `python -m sim ARGV` would run it
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        for fd, path in ((1, out), (2, err)):
            os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644), fd)
        sys.argv = [sim.cli.__file__, *argv]
        try:
            code = sim.cli.main(argv)
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 0 if exc.code is None else (print(exc.code, file=sys.stderr), 1)[1]
        except BaseException:
            traceback.print_exc()
            code = 1
        import atexit
        atexit._run_exitfuncs()  # (what the interpreter runs at its exit: pools, temporary files)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    print(os.waitstatus_to_exitcode(status), flush=True)
"""


class Commands:
    """Runs ``trainsim`` commands as ``python -m sim`` would, each in a fork of one process that
    imported trainsim once (started with the environment of ``_env``): the drift check runs
    dozens of them, and a fresh interpreter spends most of a small command's second importing."""

    def __init__(self):
        self._proc = None

    def run(self, argv: list[str]) -> tuple[int, str, str]:
        """(exit status, stdout, stderr) of ``trainsim ARGV`` in the repository root."""
        import json

        if self._proc is None:
            self._proc = subprocess.Popen([sys.executable, "-c", _FORK_SERVER], cwd=ROOT, env=_env(),
                                          stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        with tempfile.TemporaryDirectory() as tmp:
            out, err = Path(tmp) / "stdout", Path(tmp) / "stderr"
            self._proc.stdin.write(json.dumps([argv, str(out), str(err)]) + "\n")
            self._proc.stdin.flush()
            code = self._proc.stdout.readline()
            if not code:
                raise RuntimeError(f"the process that runs the commands ended (exit {self._proc.wait()})")
            return int(code), out.read_text(encoding="utf-8"), err.read_text(encoding="utf-8")

    def close(self) -> None:
        if self._proc is not None:
            self._proc.stdin.close()
            self._proc.wait()
            self._proc = None


def run_block(block: Block, commands: Commands | None = None) -> str:
    """Run a block's command (or Python example) in the repository root; its new text. With
    ``commands``, a ``trainsim`` command runs in a fork of its process (``Commands``)."""
    with tempfile.TemporaryDirectory() as tmp:
        if block.command == "python":
            script = Path(tmp) / "example.py"
            script.write_text(block.code, encoding="utf-8")
            argv = [sys.executable, str(script)]
        else:
            argv = _argv(block.command)
        if commands is not None and argv[1:3] == ["-m", "sim"]:
            code, stdout, stderr = commands.run(argv[3:])
        else:
            proc = subprocess.run(argv, cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=1800)
            code, stdout, stderr = proc.returncode, proc.stdout, proc.stderr
    want = int(block.options.get("exit", "0"))
    if code != want:
        raise RuntimeError(f"{block.where}: `{block.command}` exited {code}, expected {want}\n"
                           f"{stderr[-2000:]}")
    out = stdout + (stderr if want else "")
    return format_output(block, out)


def _image(block: Block) -> tuple[Path, Path] | None:
    spec = block.options.get("image")
    if not spec:
        return None
    src, sep, dest = spec.partition("->")
    if not sep:
        raise MarkerError(f"{block.where}: image: expected 'SRC -> DEST', got {spec!r}")
    return ROOT / src.strip(), ROOT / dest.strip()


def regenerate(paths: list[Path], check: bool, quick: bool, images: bool = True, log=print) -> list[str]:
    """Run every marked block of ``paths``; rewrite them, or (check) only report. Returns
    one message per block that drifted."""
    commands = Commands()
    try:
        return _regenerate(paths, check, quick, images, log, commands)
    finally:
        commands.close()


def _regenerate(paths, check, quick, images, log, commands) -> list[str]:
    drift = []
    for path in paths:
        text = path.read_text(encoding="utf-8")
        if with_toc(text) != text:
            drift.append(f"{_rel(path)}: the table of contents is not the page's headings")
        blocks = [b for b in find_blocks(path, with_toc(text)) if not (quick and b.slow)]
        lines = with_toc(text).split("\n")
        for b in reversed(blocks):     # from the end, so earlier indices stay valid
            new = run_block(b, commands)
            opening = "```" + b.options.get("fence", "")
            if lines[b.start] != opening:
                drift.append(f"{b.where}: the output's fence should open with {opening}")
                lines[b.start] = opening
            if new != b.quoted:
                diff = "\n".join(difflib.unified_diff(b.quoted.split("\n"), new.split("\n"), "quoted", "printed",
                                                      lineterm="", n=1))
                drift.append(f"{b.where}: `{b.command}` prints something else now\n{diff}")
                lines[b.start + 1:b.end] = new.split("\n") if new else []
            pic = _image(b) if images else None
            if pic:
                src, dest = pic
                if not src.is_file():
                    raise RuntimeError(f"{b.where}: image: the command wrote no {src}")
                if not dest.is_file() or dest.read_bytes() != src.read_bytes():
                    drift.append(f"{b.where}: {dest.relative_to(ROOT)} differs from the {src.relative_to(ROOT)} "
                                 f"the command writes now")
                    if not check:
                        shutil.copyfile(src, dest)
            log(f"{b.where}: {'ok' if new == b.quoted else ('drift' if check else 'rewritten')}")
        new_text = "\n".join(lines)
        if not check and new_text != text:
            path.write_text(new_text, encoding="utf-8")
    return drift


def documents(root: Path = ROOT) -> list[Path]:
    """README.md and every page of docs/."""
    return [root / "README.md", *sorted((root / "docs").glob("*.md"))]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("files", nargs="*", type=Path, help="Markdown files (default README.md and docs/*.md)")
    p.add_argument("--check", action="store_true", help="report drift and write nothing; exit 1 on drift")
    p.add_argument("--quick", action="store_true", help="skip the blocks marked slow")
    args = p.parse_args(argv)
    paths = [f.resolve() for f in args.files] or documents()
    try:
        drift = regenerate(paths, check=args.check, quick=args.quick)
    except (MarkerError, RuntimeError) as exc:
        print(f"regen_docs: error: {exc}", file=sys.stderr)
        return 2
    for d in drift:
        print(d, file=sys.stderr)
    if args.check and drift:
        print(f"{len(drift)} quoted output(s) drifted: python experiments/regen_docs.py", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
