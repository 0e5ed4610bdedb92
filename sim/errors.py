"""Errors the user can act on.

Every problem with input (a flag, a file, a field) is an ``InputError`` whose message
is one line naming the field, the value and what is allowed. The CLI prints it as
``trainsim: error: <message>`` and exits with code 2, never with a traceback.
A program whose actions can never all complete raises ``DeadlockError``.
"""


class InputError(ValueError):
    """Bad input: the message names the field, the value given and what is allowed."""


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


def require(cond: bool, field: str, value, allowed: str) -> None:
    """Raise ``InputError('<field>: got <value>; <allowed>')`` unless ``cond``."""
    if not cond:
        raise InputError(f"{field}: got {value!r}; {allowed}")


NEGATIVE_VALUE = __import__("re").compile(r"^-(\.?\d|inf|nan|infinity)", __import__("re").IGNORECASE)
"""What argparse should take as a (negative) value rather than a flag (``_negative_number_matcher``)."""


def from_argparse(message: str) -> InputError:
    """argparse's error as trainsim's one line: ``argument --zero: invalid choice: 5
    (choose from 0, 1, 2, 3)`` becomes ``--zero: got 5; allowed: 0, 1, 2, 3``."""
    import re

    msg = " ".join(message.split())
    m = re.match(r"argument (\S+): (.*)$", msg)
    if not m:
        return InputError(msg)
    flag, rest = m.group(1).split("/")[-1], m.group(2)
    m = re.match(r"invalid choice: (.*) \(choose from (.*)\)$", rest)
    if m:
        value, choices = m.group(1), m.group(2).replace("'", "")
        return InputError(f"{flag}: got {value}; allowed: {choices}")
    m = re.match(r"invalid (\w+) value: (.*)$", rest)
    if m:
        kind = {"int": "an integer", "float": "a number"}.get(m.group(1), f"a {m.group(1)}")
        return InputError(f"{flag}: got {m.group(2)}; expected {kind}")
    return InputError(f"{flag}: {rest}")
