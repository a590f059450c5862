"""Progress bars at a bounded rate: tqdm, redrawn at most every ``mininterval`` seconds.

On a terminal the bar is redrawn at most twice a second; when stderr is not a terminal (a redirected or logged run)
at most every 30 seconds, so a long run writes a few lines instead of one redraw per step (a redirected flow run
used to write 962 KB of bar). ``set_postfix`` does not force a redraw (tqdm's default does, which bypasses
``mininterval``): the postfix shows at the next timed refresh.
"""
from __future__ import annotations

import sys
from typing import Optional

from tqdm.auto import tqdm

__all__ = ["progress_bar", "TERMINAL_INTERVAL_S", "LOG_INTERVAL_S"]

#: seconds between redraws on a terminal / when stderr is redirected to a file or pipe
TERMINAL_INTERVAL_S = 0.5
LOG_INTERVAL_S = 30.0


class _Bar(tqdm):
    def set_postfix(self, ordered_dict=None, refresh=False, **kwargs):  # noqa: D102 - tqdm's, without the redraw
        super().set_postfix(ordered_dict, refresh=refresh, **kwargs)


def _is_terminal(stream) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False


def progress_bar(total: Optional[int] = None, desc: Optional[str] = None, disable: bool = False, file=None,
                 **kwargs) -> tqdm:
    """A tqdm bar (``tqdm.auto``: a widget in notebooks) whose redraw rate is bounded as the module doc says.

    Args:
        total: number of iterations, desc: label, disable: no bar at all, file: stream (default stderr);
        other keywords go to tqdm (an explicit ``mininterval`` wins).
    """
    stream = sys.stderr if file is None else file
    kwargs.setdefault("mininterval", TERMINAL_INTERVAL_S if _is_terminal(stream) else LOG_INTERVAL_S)
    return _Bar(total=total, desc=desc, disable=disable, file=file, **kwargs)
