"""The origin "a job ddplab starts": the launcher behind ``ddplab.run`` (``ddplab.front``), and its source (``StartedJob``) for the one
pipeline (``ddplab.engine.diagnose``).

    job (ddplab.origins.job)           what to run: resolved input, the torchrun command, the ranks' environment
    StartedJob                 the source: starts torchrun (a warm agent) when asked for its handle,
                               reads what the ranks left in the run folder as evidence
    diagnose                   watch -> collect -> judge -> RunResult -> save, as for every origin
    Views                      what the loop shows (the live status line, the echoed output) and what is
                               drawn after (timeline.png): handed in by the caller (``ddplab.run``, i.e.
                               ``ddplab.front``), so that the launcher imports no view

A job is *hung* when every live rank has made no progress for the stall window (progress is
evidence from the ranks, never the clock); ``deadline_s`` is only an optional outer limit. Whatever
happens (an exit, a stall, the deadline, Ctrl-C, a Jupyter interrupt, SIGTERM), every process of the
job is ended and checked gone before ``run`` returns.
"""
from __future__ import annotations

import dataclasses
import json
import os
import shutil
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Mapping, Sequence

from ddplab.engine import evidence
from ddplab import runfiles
from ddplab.origins import turns, warm
from ddplab.defaults import DEFAULT_SCRIPT_DEADLINE_S, DEFAULT_STALL_S, GRACE_S, Ending, Status  # noqa: F401  (re-exported)
from ddplab.engine.diagnose import Identity, diagnose
from ddplab.engine.evidence import Evidence, LiveRank, Watch
from ddplab.origins.job import (HOOK_DIR, Job, build_cluster_command, build_command, build_launch_command,  # noqa: F401
                  launch_environment, max_nproc, resolve, runs_root, socket_dir)
from ddplab.errors import DdplabError
from ddplab.result import RunResult
from ddplab.result import Snapshot
from ddplab.engine.supervise import PROGRESS_EVERY_S, Supervisor, watch  # noqa: F401
from ddplab.facts import short_path

Progress = Callable[[Snapshot], None]


@dataclass(frozen=True)
class Views:
    """What the launcher shows, handed to it by its caller (``ddplab.run``: ``ddplab.front.VIEWS``), so that
    the launcher imports no view (an import-linter contract). Without it a run shows nothing and draws nothing."""
    auto: Callable[[], Progress | None]              # progress="auto": makes the live view when the job starts
    echo: Callable[[Path, Progress | None], Callable[[], None]]  # stream=True: the ranks' output, echoed
    close: Callable[[Progress | None, RunResult | None], None]   # the live view, once the run has ended
    after: Callable[[RunResult], object]             # the result, before it is returned (timeline.png)


# ----------------------------------------------------------------------------------------------
# The entry point
# ----------------------------------------------------------------------------------------------

def run(target: str | int | os.PathLike, variant: str | None = None, nproc: int | None = None,
        deadline_s: float | None = None, args: Sequence[str] = (), env: Mapping[str, str] | None = None,
        port: int | None = 0, stream: bool = False, run_root: str | Path | None = None,
        grace_s: float = GRACE_S, stall_s: float | None = None,
        progress: Progress | str | None = "auto", cluster=None, check: bool = False,
        views: Views | None = None, max_collectives: int | None = None,
        started_at: float | None = None) -> RunResult:
    """The launcher behind ``ddplab.run`` (``ddplab.front.run``, whose docstring says what each argument
    does). ``views``: what shows ``progress`` and ``stream`` and draws the timeline (``Views``);
    ``ddplab.run`` hands the package's own (``ddplab.front.VIEWS``). Without it nothing is shown or
    drawn, and ``stream=True`` is refused.
    ``max_collectives``: end the job (status deadline) once a live rank's ledger holds more collectives
    than this (a fix-it attempt's limit, derived from its reference run).
    ``started_at``: when the command started (seconds since the epoch; default: this call): the
    result's ``startup_s`` counts from there to the start of torchrun's agent.
    """
    started_at = time.time() if started_at is None else started_at
    progress = _progress(progress)
    if stream and views is None:
        raise DdplabError("stream=True needs the views that echo the ranks' output",
                          hint="call ddplab.run (ddplab.front.run), which hands the launcher its views")
    # the lab is looked up once, here (job.lab)
    job = resolve(target, variant, nproc, deadline_s, tuple(args), port, env=env,
                  run_root=Path(run_root) if run_root else None, stall_s=stall_s, check=check)
    spec = (job.lab.extra.get("network") or {}).get(job.variant) if job.lab is not None else None
    if cluster is None and spec is not None:
        from ddplab.origins import cluster as cluster_mod
        with cluster_mod.Cluster.from_spec(spec) as made:
            return _turn(replace(job, env={**spec.get("env", {}), **job.env}), stream, grace_s, progress, made,
                         views, max_collectives, started_at)
    return _turn(job, stream, grace_s, progress, cluster, views, max_collectives, started_at)


def _progress(progress):
    """``progress`` as the loop takes it: "auto" (True too), None (False too) or a callable; anything
    else is refused before anything starts."""
    if progress is True:
        return "auto"
    if progress is False or progress is None or progress == "auto" or callable(progress):
        return None if progress is False else progress
    raise DdplabError(f"progress={progress!r} is not a way to show progress",
                      hint='use progress="auto" (a status line), None (nothing) or a function of a Snapshot')


def _turn(job: Job, stream, grace_s, progress, cluster, views: Views | None,
          max_collectives: int | None = None, started_at: float | None = None) -> RunResult:
    measured = job.lab is not None and job.lab.variant(job.variant).measured is not None
    # make workbook: a run that measures times has the machine alone; its job starts at once, its
    # ranks wait (ddplab.rank.lab) until the runs in progress have ended
    with turns.turn(alone=measured, early=True) as turn:
        return _run(StartedJob(job, cluster, turn, max_collectives, started_at), stream, grace_s, progress, views)


def _run(source: "StartedJob", stream, grace_s, progress, views: Views | None) -> RunResult:
    if progress == "auto":
        show = views.auto() if views is not None else None
    else:
        show = progress
    echo = views.echo(source.job.run_dir, show) if stream else None
    result = None
    try:
        result = diagnose(source, show=show, echo=echo, grace_s=grace_s)
    finally:
        if views is not None:
            views.close(show, result)
        if echo:
            echo()
    if views is not None:
        views.after(result)     # timeline.png of a hung or failed run, drawn on a thread of its own
    if result.status == Status.INTERRUPTED:
        print(f"ddplab: interrupted; the job was ended and its evidence saved in {short_path(result.run_dir)}",
              file=sys.stderr)
        raise KeyboardInterrupt
    return result


class StartedJob:
    """A job ddplab starts: torchrun (forked from the warm agent) in its own session, its ranks
    found from their hook's records in the run folder, ended through its process group."""
    limit = Ending.DEADLINE
    stop = True

    def __init__(self, job: Job, cluster, turn: turns.Turn, max_collectives: int | None = None,
                 started_at: float | None = None):
        self.job, self.cluster, self.turn = job, cluster, turn
        self.max_collectives = max_collectives
        self.started_at = started_at
        self.limit_s = job.deadline_s
        self.waiting: turns.Waiting | None = None
        self.identity = Identity(target=job.target, run_dir=job.run_dir, variant=job.variant,
                                 deadline_s=job.deadline_s, port=job.port, check=job.check, records_dir=job.run_dir)

    def handle(self) -> Supervisor:
        job = self.job
        job.run_dir.mkdir(parents=True, exist_ok=True)
        (job.run_dir / runfiles.RANKS).mkdir(exist_ok=True)
        socket_dir(job.run_dir).mkdir(parents=True, exist_ok=True)
        world = self.cluster.ranks(job.nproc) if self.cluster is not None else job.nproc
        cmd, penv, spec = build_command(job, self.cluster)
        self.identity = dataclasses.replace(self.identity, command=tuple(cmd))
        if spec is not None:
            (job.run_dir / runfiles.CLUSTER).write_text(json.dumps(spec, indent=2))
        go = None
        if not self.turn.ready():        # the go file is created once the machine is the run's
            go = job.run_dir / runfiles.MACHINE_GO
            penv[runfiles.GO_ENV] = f"{go} {os.getpid()}"
            self.waiting = turns.Waiting(self.turn, go)
        with open(job.run_dir / runfiles.TORCHRUN_LOG, "wb") as console:
            # Own session: Ctrl-C in a terminal does not reach torchrun directly; the job is ended by
            # the pipeline. A single-node job's agent is forked from a process that imported torch
            # already (ddplab.origins.warm: the first run may wait for that import, neither the job's time nor a stall).
            proc = warm.start(cmd, penv, console)
        t0 = time.monotonic()   # the job's clock starts with its agent
        if self.started_at is not None:   # what came before it: the command's own start-up
            self.identity = dataclasses.replace(self.identity, startup_s=round(max(0.0, time.time() - self.started_at), 3))
        # which agent ran it: forked warm (its parent: ddplab.origins.warm's process) or started cold
        (job.run_dir / runfiles.COMMAND).write_text(json.dumps(
            {"command": cmd, "env": dict(job.env), "agent_pid": proc.pid,
             "warm_parent": proc.server.proc.pid if isinstance(proc, warm.WarmProcess) else None}, indent=2))
        sup = Supervisor(proc, job.run_dir, world, job.stall_s, t0, go_file=go)
        sup.max_collectives = self.max_collectives
        return sup

    def evidence(self, seen: Watch | None, live: dict[int, LiveRank]) -> Evidence:
        if self.waiting is not None:
            self.waiting.stop()
        if not seen.leftover:   # the ranks' worker-server sockets went with them; their folder would be left in /tmp
            shutil.rmtree(socket_dir(self.job.run_dir), ignore_errors=True)
        return evidence.collect(seen, live, self.job.run_dir)

    def keep(self, ev: Evidence, result: RunResult) -> None:
        pass
