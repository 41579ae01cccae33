"""Progress bars: shown on a terminal only, and only when asked for."""

import io

from factkernels.progress import progress_bar


class _Terminal(io.StringIO):
    def isatty(self):
        return True


def test_bar_off_unless_terminal_and_enabled():
    assert progress_bar(range(3), file=io.StringIO()).disable  # a pipe or log file: no bar
    assert progress_bar(range(3), file=_Terminal(), enabled=False).disable
    terminal = _Terminal()
    with progress_bar(range(3), file=terminal, desc="work") as bar:
        assert not bar.disable and list(bar) == [0, 1, 2]
    assert "work" in terminal.getvalue()
