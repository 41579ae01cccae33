"""The one place progress bars are made: on for long work, off when stderr is not a terminal."""

from __future__ import annotations

from tqdm.auto import tqdm


def progress_bar(iterable=None, *, enabled: bool = True, **kwargs) -> tqdm:
    """``tqdm(iterable, **kwargs)`` shown only when ``enabled`` and stderr is a terminal.

    tqdm's ``disable=None`` is what turns a bar off on a non-terminal (logs, CI, pipes).
    """
    return tqdm(iterable, disable=None if enabled else True, **kwargs)
