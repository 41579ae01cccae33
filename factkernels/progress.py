"""The one place progress bars are made: on for long work, off when stderr is not a terminal (where long runs
say what they do in timestamped lines instead)."""

from __future__ import annotations

import sys
import time

from tqdm.auto import tqdm


def progress_bar(iterable=None, *, enabled: bool = True, **kwargs) -> tqdm:
    """``tqdm(iterable, **kwargs)`` shown only when ``enabled`` and stderr is a terminal.

    tqdm's ``disable=None`` is what turns a bar off on a non-terminal (logs, CI, pipes).
    """
    return tqdm(iterable, disable=None if enabled else True, **kwargs)


def log_line(text: str) -> None:
    """``text`` on stderr after the time of day, flushed: what a long run writes to its log, where bars are off."""
    print(f"[{time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)
