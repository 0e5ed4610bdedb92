"""A one-line progress display on stderr, redrawn in place, for long simulations.

``Progress`` writes ``simulating 1024 GPUs (plan 2/5: 1f1b)... 40%  12.3 s`` on one
line of stderr and rewrites it (``\\r`` and erase-to-end-of-line) as work advances;
a background thread keeps the elapsed time ticking while one long simulation runs
(the engine itself is never touched). It stays silent when stderr is not a terminal
(pipes, files, CI logs, tests), and draws nothing at all for work that finishes in
under ``delay_s``, so quick commands never flicker. ``close`` erases the line, so what
the command prints afterwards starts on a clean line.

    with Progress(total=len(plans)) as bar:
        for i, plan in enumerate(plans):
            bar.update(f"simulating {gpus} GPUs (plan {i + 1}/{len(plans)}: {name})", done=i)
            ...

``ProgressBar`` is the sweeps' and searches' display: a bar with the count, rate and ETA
of many short points on a terminal, and elsewhere (where nothing else would show for
minutes) a plain line every few seconds: ``search: 37/112 plans simulated, 41.2 s elapsed``.
"""

from __future__ import annotations

import sys
import threading
import time


class Progress:
    """A status line on a terminal; nothing otherwise (``enabled`` forces either)."""

    def __init__(self, total: int | None = None, *, stream=None, enabled: bool | None = None,
                 delay_s: float = 0.5, interval_s: float = 0.2):
        self.stream = stream if stream is not None else sys.stderr
        if enabled is None:
            isatty = getattr(self.stream, "isatty", None)
            enabled = bool(isatty and isatty())
        self.enabled = enabled
        self.total = total
        self.done = 0
        self.message = ""
        self.delay_s, self.interval_s = delay_s, interval_s
        self.start = time.monotonic()
        self._drawn = False
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if self.enabled:
            self._thread = threading.Thread(target=self._tick, name="trainsim-progress", daemon=True)
            self._thread.start()

    def line(self) -> str:
        """The text of the status line now."""
        parts = [f"{self.message}..." if self.message else "working..."]
        if self.total:
            parts.append(f"{self.done / self.total * 100:.0f}%")
        parts.append(f"{time.monotonic() - self.start:.1f} s")
        return " ".join(parts)

    def update(self, message: str | None = None, done: int | None = None) -> None:
        """Set the message and/or how many of ``total`` are done, and redraw."""
        if message is not None:
            self.message = message
        if done is not None:
            self.done = done
        self._draw()

    def step(self, n: int = 1) -> None:
        self.update(done=self.done + n)

    def _draw(self, force: bool = False) -> None:
        if not self.enabled:
            return
        if not force and time.monotonic() - self.start < self.delay_s:
            return
        with self._lock:
            self.stream.write("\r\x1b[K" + self.line())
            self.stream.flush()
            self._drawn = True

    def _tick(self) -> None:
        while not self._stop.wait(self.interval_s):
            if time.monotonic() - self.start >= self.delay_s:
                self._draw(force=True)

    def close(self) -> None:
        """Stop redrawing and erase the line."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self.enabled and self._drawn:
            with self._lock:
                self.stream.write("\r\x1b[K")
                self.stream.flush()
                self._drawn = False

    def __enter__(self) -> "Progress":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


LINE_EVERY_S = 5.0
"""How often ``ProgressBar`` writes its plain line when stderr is not a terminal (seconds)."""


class ProgressBar:
    """Counted progress of many short points (sweeps and searches: plans simulated).

    On a terminal: ``search: [#####.....] 12/40  30%  3.1 plans/s  ETA 0:09``, redrawn in
    place, and a new line when closed. Elsewhere (a pipe, a file, a CI log), where a
    redrawn line would pile up: one plain line every ``every_s`` seconds,
    ``search: 12/40 plans simulated, 41.2 s elapsed``, written by a background thread so
    that it comes even while one long simulation runs, and nothing for work that ends
    sooner. ``enabled=False`` is silent; ``enabled=True`` draws the bar wherever the
    stream goes. ``start`` (a ``time.monotonic()`` value) counts the elapsed time from
    the start of the command's work rather than from the bar's creation.

    ``total=None`` starts it in a *phase* (``phase``: ``search: enumerating plans...`` on a
    terminal as soon as it begins, ``search: enumerating plans, 5.0 s elapsed`` every few
    seconds elsewhere) until ``set_total`` gives the count; ``set_total`` may also
    correct the count as it becomes known (a search learns what its pruning leaves).
    """

    def __init__(self, total: int | None, enabled: bool | None = None, stream=None, label: str = "", *,
                 every_s: float | None = None, start: float | None = None, noun: str = "plans simulated"):
        self.stream = stream or sys.stderr
        isatty = getattr(self.stream, "isatty", None)
        tty = bool(isatty and isatty())
        self.mode = "bar" if enabled or (enabled is None and tty) else "lines" if enabled is None else "off"
        self.total, self.done, self.label, self.noun = total, 0, label, noun
        self.what = ""
        self.start = time.monotonic() if start is None else start
        self.every_s = LINE_EVERY_S if every_s is None else every_s
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        if self.mode == "lines":
            self._thread = threading.Thread(target=self._tick, name="trainsim-progress-lines", daemon=True)
            self._thread.start()

    def line(self) -> str:
        """The plain progress line: ``search: 12/40 plans simulated, 41.2 s elapsed``."""
        head = f"{self.label}: " if self.label else ""
        if self.total is None:
            return f"{head}{self.what or 'starting'}, {time.monotonic() - self.start:.1f} s elapsed"
        return f"{head}{self.done}/{self.total} {self.noun}, {time.monotonic() - self.start:.1f} s elapsed"

    def phase(self, what: str) -> None:
        """Say what is under way before the count starts: on a terminal at once (redrawn in
        place), off a terminal in the periodic line until ``set_total``."""
        self.what = what
        if self.mode != "bar":  # off a terminal the periodic line says it (quick work: nothing)
            return
        head = f"{self.label}: " if self.label else ""
        with self._lock:
            self.stream.write(f"\r\x1b[K{head}{what}...")
            self.stream.flush()

    def set_total(self, total: int) -> None:
        """The count of points to expect (never below those done)."""
        self.total = max(total, self.done)

    def _tick(self) -> None:
        while not self._stop.wait(self.every_s):
            with self._lock:
                self.stream.write(self.line() + "\n")
                self.stream.flush()

    def step(self, n: int = 1) -> None:
        self.done += n
        if self.total is not None and self.done > self.total:
            self.total = self.done
        if self.mode != "bar" or self.total is None:
            return
        elapsed = time.monotonic() - self.start
        rate = self.done / elapsed if elapsed > 0 else 0.0
        left = (self.total - self.done) / rate if rate > 0 else 0.0
        frac = self.done / self.total if self.total else 1.0
        bar = "#" * int(frac * 30)
        head = f"{self.label}: " if self.label else ""
        self.stream.write(f"\r\x1b[K{head}[{bar:<30}] {self.done}/{self.total} {frac * 100:3.0f}%  {rate:.1f} plans/s  "
                          f"ETA {int(left) // 60}:{int(left) % 60:02d} ")
        self.stream.flush()

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self.mode == "bar":
            self.stream.write("\n")
            self.stream.flush()
        self.mode = "off"

    def __enter__(self) -> "ProgressBar":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
