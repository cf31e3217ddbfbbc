"""Live views of a job while the loop watches it: the status line (a terminal's stderr, or a Jupyter
cell updated in place) and the ranks' own output echoed (``stream=True``). They get a
``result.Snapshot`` or read the run folder; the loop only calls them, and nothing reads them back.
"""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Callable

from ddplab.views import render
from ddplab import runfiles
from ddplab.result import RunResult, Snapshot


class TerminalProgress:
    """One line on a terminal's stderr, rewritten in place; cleared when the run ends."""

    def __init__(self, stream=None):
        self.stream = stream or sys.stderr
        self.width = 0

    def __call__(self, snap: Snapshot) -> None:
        line = "ddplab " + render.status_line(snap)
        self.stream.write("\r" + line.ljust(self.width))
        self.stream.flush()
        self.width = len(line)

    def close(self, result: RunResult | None = None) -> None:
        if self.width:
            self.stream.write("\r" + " " * self.width + "\r")
            self.stream.flush()
            self.width = 0


class NotebookProgress:
    """One output line in a Jupyter cell, updated in place (a display handle)."""

    def __init__(self):
        from IPython.display import display
        self.handle = display({"text/plain": "ddplab: starting"}, raw=True, display_id=True)

    def __call__(self, snap: Snapshot) -> None:
        if self.handle is not None:
            self.handle.update({"text/plain": "ddplab " + render.status_line(snap)}, raw=True)

    def close(self, result: RunResult | None = None) -> None:
        if self.handle is not None and result is not None:
            self.handle.update({"text/plain": "ddplab: " + render.headline(result)}, raw=True)


def _in_notebook() -> bool:
    ip = sys.modules.get("IPython")
    try:
        shell = ip.get_ipython() if ip is not None else None
    except Exception:
        return False
    return shell is not None and type(shell).__name__ == "ZMQInteractiveShell"


def auto_progress():
    """A terminal status line when stderr is a terminal, a live cell output in Jupyter, else nothing."""
    if _in_notebook():
        return NotebookProgress()
    if hasattr(sys.stderr, "isatty") and sys.stderr.isatty():
        return TerminalProgress()
    return None


class Echo:
    """The ranks' output, echoed line by line as ``[rank N] ...`` (``ddplab run --stream``)."""

    def __init__(self, run_dir: Path, before_line: Callable[[], None] | None = None):
        self.run_dir, self.offsets, self.before_line = run_dir, {}, before_line

    def __call__(self) -> None:
        for rank, path in runfiles.rank_logs(self.run_dir):
            start = self.offsets.get(path, 0)
            try:
                with open(path, "rb") as f:
                    f.seek(start)
                    chunk = f.read()
            except OSError:
                continue
            end = chunk.rfind(b"\n")
            if end < 0:
                continue  # no complete line yet
            self.offsets[path] = start + end + 1
            if self.before_line:
                self.before_line()
            for line in chunk[:end].decode(errors="replace").splitlines():
                print(line if line.startswith("[rank") else f"[rank {rank}] {line}", flush=True)
