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

``ProgressBar`` is the sweeps' display: a bar with the count, rate and ETA of many
short points, also on a terminal only.
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


class ProgressBar:
    """``[#####.....] 12/40  30%  3.1 plans/s  ETA 0:09`` on a terminal, a new line when
    closed; nothing otherwise (sweeps: many short points, counted)."""

    def __init__(self, total: int, enabled: bool | None = None, stream=None, label: str = ""):
        self.stream = stream or sys.stderr
        self.enabled = self.stream.isatty() if enabled is None else enabled
        self.total, self.done, self.start, self.label = total, 0, time.monotonic(), label

    def step(self, n: int = 1) -> None:
        self.done += n
        if not self.enabled:
            return
        elapsed = time.monotonic() - self.start
        rate = self.done / elapsed if elapsed > 0 else 0.0
        left = (self.total - self.done) / rate if rate > 0 else 0.0
        frac = self.done / self.total if self.total else 1.0
        bar = "#" * int(frac * 30)
        self.stream.write(f"\r{self.label}[{bar:<30}] {self.done}/{self.total} {frac * 100:3.0f}%  {rate:.1f} plans/s  "
                          f"ETA {int(left) // 60}:{int(left) % 60:02d} ")
        self.stream.flush()

    def close(self) -> None:
        if self.enabled:
            self.stream.write("\n")
            self.stream.flush()
