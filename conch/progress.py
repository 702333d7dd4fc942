"""Progress with ETA for long commands: a redrawn bar on a terminal, plain lines when stderr is not one (CI
logs, `2> file`), so logs stay readable and greppable.

Why not rich/tqdm: both redraw by default and neither is a dependency of conch; this is a screenful of code.
Plain mode prints at most every `every_s` seconds (and always the last item), never one line per item.
"""

from __future__ import annotations

import sys
import time
from typing import IO


def fmt_seconds(s: float) -> str:
    s = max(0, int(s))
    h, rem = divmod(s, 3600)
    m, sec = divmod(rem, 60)
    return f"{h}:{m:02d}:{sec:02d}" if h else f"{m:02d}:{sec:02d}"


class Progress:
    """`p = Progress(40, "eval warm"); p.update(info="task-1 3/3"); ...; p.close()`.

    `late`: the bar is created after the first item finished (a callback that only hears of finished items), so
    the rate is measured from the first update on, not from creation."""

    def __init__(self, total: int, label: str, stream: IO[str] | None = None, every_s: float = 10.0,
                 tty: bool | None = None, width: int = 24, late: bool = False) -> None:
        self.total, self.label, self.every_s, self.width = max(0, total), label, every_s, width
        self.stream = stream if stream is not None else sys.stderr
        self.tty = tty if tty is not None else bool(getattr(self.stream, "isatty", lambda: False)())
        self.done = 0
        self.t0 = time.monotonic()
        self._last = float("-inf")
        self._open = False
        self.late = late
        self._first: tuple[float, int] | None = None

    def eta(self) -> float | None:
        if not self.done or not self.total:
            return None
        t0, d0 = self._first if self.late and self._first else (self.t0, 0)
        if self.done <= d0:
            return None
        return (time.monotonic() - t0) / (self.done - d0) * (self.total - self.done)

    def line(self, info: str = "") -> str:
        elapsed = fmt_seconds(time.monotonic() - self.t0)
        eta = self.eta()
        eta_txt = "done" if self.done >= self.total else f"ETA {fmt_seconds(eta)}" if eta is not None else "ETA ?"
        pct = self.done / self.total if self.total else 1.0
        if self.tty:
            fill = int(pct * self.width)
            bar = "[" + "#" * fill + "." * (self.width - fill) + "] "
        else:
            bar = ""
        return f"{self.label} {bar}{self.done}/{self.total} {pct:4.0%}  {elapsed} {eta_txt}" + (f"  {info}" if info else "")

    def update(self, n: int = 1, info: str = "") -> None:
        self.done = min(self.total, self.done + n) if self.total else self.done + n
        now = time.monotonic()
        if self._first is None:
            self._first = (now, self.done)
        last = self.done >= self.total
        if self.tty:
            self.stream.write("\r\033[K" + self.line(info))
            self._open = True
            if last:
                self.stream.write("\n")
                self._open = False
            self.stream.flush()
        elif last or now - self._last >= self.every_s:
            print(self.line(info), file=self.stream, flush=True)
            self._last = now

    def close(self) -> None:
        if self._open:
            self.stream.write("\n")
            self.stream.flush()
            self._open = False
