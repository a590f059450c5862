"""Progress that fits a terminal and a log file: a tqdm bar on a terminal, plain lines elsewhere.

* stderr (or the stream given) is a terminal, or a notebook shows tqdm's widget: a tqdm bar redrawn at most every
  :data:`TERMINAL_INTERVAL_S` seconds. ``set_postfix`` does not force a redraw (tqdm's default does, which bypasses
  ``mininterval``): the postfix shows at the next timed refresh.
* anything else (a file, a pipe, a CI log): no bar and no carriage return. A :class:`LogLines` writes one ordinary
  line (``desc: n/total [elapsed, rate, postfix]``) when it starts, then at most every :data:`LOG_INTERVAL_S` seconds
  and a last one when it closes, so a long run writes a few readable lines instead of one redraw per step.

Both honour ``delay=`` (nothing is shown before that many seconds: a calibration that answers at once prints
nothing) and ``disable=``.
"""
from __future__ import annotations

import sys
import time
from typing import Optional

from tqdm.auto import tqdm
from tqdm.autonotebook import tqdm as _notebook_or_std
from tqdm.std import tqdm as _std_tqdm

__all__ = ["progress_bar", "LogLines", "TERMINAL_INTERVAL_S", "LOG_INTERVAL_S"]

#: seconds between redraws on a terminal / between lines when the stream is a file or pipe
TERMINAL_INTERVAL_S = 0.5
LOG_INTERVAL_S = 10.0


class _Bar(tqdm):
    def set_postfix(self, ordered_dict=None, refresh=False, **kwargs):  # noqa: D102 - tqdm's, without the redraw
        super().set_postfix(ordered_dict, refresh=refresh, **kwargs)


def _is_terminal(stream) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False


class LogLines:
    """The progress of a run on a stream that is not a terminal: plain lines, at most one every ``interval`` s.

    The subset of tqdm's interface that fastdpot's loops use: ``update``, ``set_postfix``, ``set_description``,
    ``close``, ``n``, ``total``, ``disable`` and the context-manager protocol.

    Args:
        total: number of iterations (None: unknown, the line shows the count only). desc: the label.
        disable: write nothing. file: the stream (default: stderr at each write). interval: seconds between lines.
        delay: nothing is written before this many seconds (and nothing at all by a shorter run).
        unit: what is counted (shown in the rate).
    """

    def __init__(self, total: Optional[int] = None, desc: Optional[str] = None, disable: bool = False, file=None,
                 interval: float = LOG_INTERVAL_S, delay: float = 0.0, unit: str = "it", **_ignored):
        self.total, self.desc, self.disable, self.n = total, desc or "", bool(disable), 0
        self._file, self._interval, self._delay, self._unit = file, float(interval), float(delay), unit.strip()
        self._start = self._last = time.monotonic()
        self._postfix = ""
        self._written = False
        self._closed = False
        if not self.disable and self._delay <= 0:
            self._write()  # what the run is about, at once (a delayed one first shows after its delay)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def _line(self) -> str:
        elapsed = time.monotonic() - self._start
        count = f"{self.n}/{self.total}" if self.total is not None else f"{self.n} {self._unit}"
        rate = f"{self.n / elapsed:.3g} {self._unit}/s" if elapsed > 0 else f"? {self._unit}/s"
        fields = ", ".join(f for f in (_std_tqdm.format_interval(elapsed), rate, self._postfix) if f)
        return f"{self.desc + ': ' if self.desc else ''}{count} [{fields}]"

    def _write(self) -> None:
        stream = sys.stderr if self._file is None else self._file
        stream.write(self._line() + "\n")
        stream.flush()
        self._written = True
        self._last = time.monotonic()

    def update(self, n: int = 1) -> None:
        """Count ``n`` more iterations; write a line when ``interval`` s passed since the last one (and ``delay``
        since the start)."""
        self.n += n
        now = time.monotonic()
        if not self.disable and now - self._start >= self._delay and \
                (now - self._last >= self._interval or (not self._written and self._delay > 0)):
            self._write()

    def set_postfix(self, ordered_dict=None, refresh: bool = False, **kwargs) -> None:
        """The ``key=value`` fields shown at the end of the next line."""
        items = dict(ordered_dict or {}, **kwargs)
        self._postfix = ", ".join(f"{k}={v}" for k, v in items.items())

    def set_description(self, desc: Optional[str] = None, refresh: bool = True) -> None:
        """The label of the next line."""
        self.desc = desc or ""

    def refresh(self) -> None:
        """Nothing: lines are written by :meth:`update` and :meth:`close`."""

    def close(self) -> None:
        """Write the last line (unless disabled, or nothing was counted before ``delay``)."""
        if self._closed:
            return
        self._closed = True
        if not self.disable and (self.n or self.total) and time.monotonic() - self._start >= self._delay:
            self._write()


def progress_bar(total: Optional[int] = None, desc: Optional[str] = None, disable: bool = False, file=None,
                 **kwargs):
    """A tqdm bar on a terminal or in a notebook (``tqdm.auto``), :class:`LogLines` on any other stream.

    Args:
        total: number of iterations, desc: label, disable: show nothing, file: stream (default stderr); other
            keywords go to tqdm (an explicit ``mininterval`` wins; ``delay`` and ``unit`` also apply to the lines).
    """
    stream = sys.stderr if file is None else file
    if _is_terminal(stream) or _notebook_or_std is not _std_tqdm:  # a terminal, or tqdm's notebook widget
        kwargs.setdefault("mininterval", TERMINAL_INTERVAL_S)
        return _Bar(total=total, desc=desc, disable=disable, file=file, **kwargs)
    return LogLines(total=total, desc=desc, disable=disable, file=file, interval=kwargs.get("mininterval",
                                                                                             LOG_INTERVAL_S),
                    delay=kwargs.get("delay", 0.0), unit=kwargs.get("unit", "it"))
