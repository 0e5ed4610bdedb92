"""Errors the user can act on.

Every problem with input (a flag, a file, a field) is an ``InputError`` whose message
is one line naming the field, the value and what is allowed. The CLI prints it as
``trainsim: error: <message>`` and exits with code 2, never with a traceback.
A program whose actions can never all complete raises ``DeadlockError``.
"""


class InputError(ValueError):
    """Bad input: the message names the field, the value given and what is allowed.

    Raised by ``require`` (or with ``field``/``value``/``allowed`` given), it also carries
    them as attributes, and ``setting`` names the schema setting it is about (a
    ``ParallelPlan`` attribute such as ``tp``, or a setting such as ``gpus``), so that a front
    end can name it as its user wrote it: the flag on the command line, the key and line in
    an experiment file, the keyword in Python (``renamed``). Nothing is parsed back out of
    the message."""

    def __init__(self, message: str | None = None, *, field: str | None = None, value=None,
                 allowed: str | None = None, setting: str | None = None, shown: str | None = None,
                 path: str | None = None, line: int | None = None):
        self.field, self.value, self.allowed, self.setting = field, value, allowed, setting
        self.path, self.line = path, line
        """Where the value was written (an experiment file and its line), when it was."""
        self.shown = shown
        """How the value is written in the message (default its repr; a flag's text as typed)."""
        super().__init__(message if message is not None else f"{self.place}{field}: {self.detail}")

    @property
    def place(self) -> str:
        """Where the value was written, as the message begins: ``'e.toml:12: '``, ``'e.toml: '``
        or ``''``."""
        if self.path is None:
            return ""
        return f"{self.path}:{self.line}: " if self.line is not None else f"{self.path}: "

    def in_file(self, path, line: int | None = None) -> "InputError":
        """The same error as met while reading the file ``path``: itself when it names that
        file already (``self.path``), else its message after the file's name, with the file
        recorded (and its value, what is allowed and its setting kept)."""
        path = str(path)
        if self.path == path:
            return self
        place = f"{path}:{line}: " if line is not None else f"{path}: "
        return InputError(f"{place}{self}", field=self.field, value=self.value, allowed=self.allowed,
                          setting=self.setting, shown=self.shown, path=path, line=line)

    @property
    def detail(self) -> str:
        """What is wrong, without the field's name: ``got 0; expected an integer > 0``."""
        shown = repr(self.value) if self.shown is None else self.shown
        return f"got {shown}; {self.allowed}"

    def renamed(self, name: str) -> "InputError":
        """The same error naming its field ``name`` (``--tensor-model-parallel-size``,
        ``exp.toml:9: plan.tensor_model_parallel_size``)."""
        return InputError(field=name, value=self.value, allowed=self.allowed, setting=self.setting, shown=self.shown)


class DeadlockError(RuntimeError):
    """A program cannot complete: some actions wait for something that never happens.

    ``stuck`` maps each rank with unfinished work to a one-line description of the action
    it is blocked on and what that action waits for.
    """

    def __init__(self, stuck: dict[int, str], time_s: float):
        self.stuck = dict(sorted(stuck.items()))
        self.time_s = time_s
        lines = [f"rank {r}: {why}" for r, why in self.stuck.items()]
        shown = lines[:16]
        more = f"; ... and {len(lines) - 16} more ranks" if len(lines) > 16 else ""
        super().__init__(
            f"deadlock at t={time_s:.6g} s: {len(lines)} rank(s) stuck: " + "; ".join(shown) + more
        )


def require(cond: bool, field: str, value, allowed: str, *, setting: str | None = None,
            path: str | None = None) -> None:
    """Raise ``InputError('<field>: got <value>; <allowed>')`` unless ``cond``; ``setting``:
    the schema setting it is about (see ``InputError``); ``path``: the file the value was
    read from (``'config.json: <field>: ...'``)."""
    if not cond:
        raise InputError(field=field, value=value, allowed=allowed, setting=setting,
                         path=None if path is None else str(path))
