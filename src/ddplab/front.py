"""``ddplab.run``: the launcher (``ddplab.origins.launch``) handed the views it shows.

The launcher imports no view (an import-linter contract): the live status line and the echoed output
(``ddplab.views.progress``) and the timeline drawn after a hung or failed run (``ddplab.views.timeline``)
are handed to it here, as ``launch.Views``. The CLI, the course and ``import ddplab; ddplab.run(...)``
call this ``run``; it sits above the origins and the views (pyproject.toml's layers).
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Mapping, Sequence

from ddplab.defaults import GRACE_S
from ddplab.origins import launch
from ddplab.result import RunResult
from ddplab.views import progress as _progress
from ddplab.views import timeline


def _echo(run_dir: Path, show) -> _progress.Echo:
    """The ranks' output echoed; a terminal's status line is cleared before each line."""
    return _progress.Echo(run_dir, before_line=show.close if isinstance(show, _progress.TerminalProgress) else None)


def _close(show, result: RunResult | None) -> None:
    """The live view when the run has ended: a terminal's line cleared, a notebook's set to the headline."""
    if isinstance(show, (_progress.TerminalProgress, _progress.NotebookProgress)):
        show.close(result)


VIEWS = launch.Views(auto=_progress.auto_progress, echo=_echo, close=_close, after=timeline.save_later)


def run(target: str | int | os.PathLike, variant: str | None = None, nproc: int | None = None,
        deadline_s: float | None = None, args: Sequence[str] = (), env: Mapping[str, str] | None = None,
        port: int | None = 0, stream: bool = False, run_root: str | Path | None = None,
        grace_s: float = GRACE_S, stall_s: float | None = None,
        progress: launch.Progress | str | None = "auto", cluster=None, check: bool = False,
        max_collectives: int | None = None, started_at: float | None = None) -> RunResult:
    """Run a lab (number or name) or any torchrun-able script on ``nproc`` local ranks.

    Returns a RunResult whose ``status`` is "ok", "failed" (a rank exited with an error), "hung"
    (every live rank made no progress for ``stall_s`` seconds: evidence read, job ended),
    "deadline" (still making progress at the optional outer limit ``deadline_s``) or "interrupted"
    (a KeyboardInterrupt: the job is ended the same way, the result saved, then it propagates).
    ``progress``: "auto" (a status line on a terminal or in Jupyter), None, or a callable that gets
    a ``result.Snapshot`` about once a second.
    ``cluster``: a ``ddplab.origins.cluster.Cluster`` (entered): a multi-node job, ``nproc`` ranks on each of
    its nodes (one torchrun agent per node). A lab whose LAB dict names a ``network`` for the variant
    gets a cluster of its own, made and removed around the run.
    ``check``: compare what each rank recorded about its replicas, gradients and data after the run
    (``result.check``, a ``ddplab.facts.CheckReport``), with no collective added to the job.
    ``stream``: echo the ranks' output as ``[rank N] ...`` while the job runs.
    ``max_collectives``: end the job (status "deadline") once a live rank's ledger holds more collectives than
    this, busy or not (a fix-it attempt's limit, derived from its reference run).
    ``started_at``: when the command started (seconds since the epoch; default: this call): the result's
    ``startup_s`` counts from there to the start of torchrun's agent, and the headline's seconds include it.
    """
    return launch.run(target, variant=variant, nproc=nproc, deadline_s=deadline_s, args=args, env=env, port=port,
                      stream=stream, run_root=run_root, grace_s=grace_s, stall_s=stall_s, progress=progress,
                      cluster=cluster, check=check, views=VIEWS, max_collectives=max_collectives,
                      started_at=started_at)
