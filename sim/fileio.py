"""Reading input files and writing output files, strictly and atomically.

Every file a user hands trainsim is read here: a missing file, a folder, an unreadable
file, an empty file or bytes that are not UTF-8 are an ``InputError`` naming the file
(and, for bytes, the line), before any parser sees the text. JSON syntax errors name
the line; ``NaN`` and ``Infinity`` parse (Python writes them), and each loader's checks
reject them, naming the key.

Every output file is written through a temporary file in the same folder and a rename
(``atomic_path``), so a reader never sees half a file and a failed or interrupted write
leaves nothing behind; the temporary gets the usual permissions (0666 less the umask),
not ``mkstemp``'s 0600. ``check_output_dir`` and ``check_output_file`` vet an output
flag before any work starts (a file where a folder is wanted, a folder where a file is
wanted, a path under a file, a folder that cannot be written), so a bad ``--out`` costs
nothing and writes nothing.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from pathlib import Path

from sim.errors import InputError


# ---------------------------------------------------------------- reading
def read_bytes(path: str | Path, what: str | None = None) -> bytes:
    """The bytes of ``path``; an ``InputError`` naming it (after ``what``, e.g. the flag,
    when given) when it cannot be read."""
    p = Path(path)
    pre = f"{what}: " if what else ""
    try:
        return p.read_bytes()
    except FileNotFoundError:
        why = "file not found (cannot read it)"
    except IsADirectoryError:
        why = "is a directory, expected a file (cannot read it)"
    except OSError as exc:
        why = f"cannot read it ({exc.strerror or exc})"
    raise InputError(f"{pre}{p}: {why}", value=str(path), allowed=why, path=None if what else str(p))


def decode(data: bytes, where: str, allow_empty: bool = False) -> str:
    """UTF-8 text of ``data`` (a leading byte-order mark dropped); an ``InputError`` naming
    ``where`` and the line of the first bad byte, or an empty file."""
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise InputError(f"{where}:{line}: not UTF-8 text (byte 0x{data[exc.start]:02x} at offset {exc.start}); "
                         "expected a text file (binary or another encoding?)", path=where, line=line) from None
    if not allow_empty and not text.strip():
        raise InputError(f"{where}: the file is empty" + (" (0 bytes)" if not data else " (only whitespace)"),
                         path=where)
    return text


def read_text(path: str | Path, what: str | None = None, allow_empty: bool = False) -> str:
    """The UTF-8 text of ``path``, checked (see the module doc)."""
    return decode(read_bytes(path, what), str(path), allow_empty)


def loads_json(text: str, where: str):
    """Parse JSON text; a syntax error names the line. (``NaN`` and ``Infinity`` parse, as
    Python writes them; each loader's checks then reject them naming the key.)"""
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        last = exc.lineno >= len(text.rstrip().splitlines())
        hint = "; the file looks truncated" if last else ""
        raise InputError(f"{where}:{exc.lineno}: not valid JSON ({exc.msg}, column {exc.colno}){hint}",
                         path=where, line=exc.lineno) from None


def read_json(path: str | Path, what: str | None = None):
    """The parsed JSON of ``path``, checked (see the module doc)."""
    return loads_json(read_text(path, what), str(path))


# ---------------------------------------------------------------- writing
def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _cannot_write(path: Path, exc: OSError) -> InputError:
    return InputError(f"{path}: cannot write it ({exc.strerror or exc})")


@contextlib.contextmanager
def atomic_path(path: str | Path, suffix: str = ""):
    """Yield a temporary path beside ``path``; when the block succeeds it is renamed to
    ``path``, otherwise removed. ``suffix`` ends the temporary's name (matplotlib picks
    the format from it). A failure of the file system is an ``InputError`` naming ``path``."""
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=suffix, dir=path.parent)
        os.close(fd)
    except OSError as exc:
        raise _cannot_write(path, exc) from None
    try:
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600; give the file the usual mode
        yield tmp
        os.replace(tmp, path)
    except OSError as exc:
        Path(tmp).unlink(missing_ok=True)
        raise _cannot_write(path, exc) from None
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_text_atomic(text: str, path: str | Path) -> Path:
    """Write ``text`` (UTF-8) to ``path`` through a temporary file and a rename."""
    with atomic_path(path) as tmp:
        with open(tmp, "w", encoding="utf-8") as fh:
            fh.write(text)
    return Path(path)


def write_json_atomic(obj, path: str | Path, *, indent: int | None = None, sort_keys: bool = True,
                      compact: bool = True) -> Path:
    """Write ``obj`` as JSON (one line, sorted keys, unless told otherwise) and a newline,
    through a temporary file and a rename."""
    separators = (",", ":") if compact and indent is None else None
    with atomic_path(path) as tmp:
        with open(tmp, "w", encoding="utf-8") as fh:
            json.dump(obj, fh, separators=separators, sort_keys=sort_keys, indent=indent)
            fh.write("\n")
    return Path(path)


# ---------------------------------------------------------------- output flags
def _nearest_existing(p: Path) -> Path:
    p = Path(os.path.abspath(p))
    while not p.exists() and p != p.parent:
        p = p.parent
    return p


def _check_parent(p: Path, flag: str, what: str) -> None:
    base = _nearest_existing(p.parent if what == "file" else p)
    if not base.is_dir():
        raise InputError(f"{flag}: got {str(p)!r}; {base} is a file, so no {what} can be made under it")
    if not os.access(base, os.W_OK | os.X_OK):
        raise InputError(f"{flag}: got {str(p)!r}; {base} is not writable")


def check_output_dir(path: str | Path | None, flag: str = "--out") -> Path | None:
    """Refuse an output folder that cannot be made or written, before any work."""
    if path is None:
        return None
    p = Path(path)
    if str(path) == "":
        raise InputError(f"{flag}: got ''; expected a folder")
    if p.exists() and not p.is_dir():
        raise InputError(f"{flag}: got {str(p)!r}; it is a file, expected a folder (new or existing)")
    _check_parent(p, flag, "folder")
    return p


def check_output_file(path: str | Path | None, flag: str = "--out", suffix: str | None = None) -> Path | None:
    """Refuse an output file that is a folder, lies under a file, cannot be written, or
    lacks ``suffix``, before any work."""
    if path is None:
        return None
    p = Path(path)
    if suffix is not None and p.suffix != suffix:
        raise InputError(f"{flag}: got {str(path)!r}; expected a path ending in {suffix}")
    if p.is_dir():
        raise InputError(f"{flag}: got {str(p)!r}; it is a directory, expected a file")
    _check_parent(p, flag, "file")
    return p
