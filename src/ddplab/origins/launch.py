"""Run a job and judge it: the one entry point (``ddplab.run``), wiring the seams together.

    job (ddplab.origins.job)           what to run: resolved input, the torchrun command, the ranks' environment
    supervise (ddplab.engine.supervise)  the one watch loop: each rank's progress (CPU, ledger, stack); the stall rule
    evidence (ddplab.engine.evidence) collect: what the loop saw, the live ranks, what the ranks left behind
    classify (ddplab.engine.classify) judge(evidence): status, signature, stall facts, per-rank facts
    render (ddplab.views.render)     sentences, HTML and the live status line, made only when shown

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
from dataclasses import replace
from pathlib import Path
from typing import Callable, Mapping, Sequence

from ddplab.engine import classify, evidence
from ddplab.views import render, timeline
from ddplab import runfiles
from ddplab.origins import turns, warm
from ddplab.defaults import DEFAULT_SCRIPT_DEADLINE_S, DEFAULT_STALL_S, GRACE_S  # noqa: F401  (re-exported)
from ddplab.origins.job import (HOOK_DIR, Job, build_cluster_command, build_command, build_launch_command,  # noqa: F401
                  launch_environment, max_nproc, resolve, runs_root, socket_dir)
from ddplab.engine import check as check_mod
from ddplab.result import RunResult
from ddplab.engine.supervise import PROGRESS_EVERY_S, Snapshot, Supervisor, watch  # noqa: F401
from ddplab.engine.stacks import short_path

Progress = Callable[[Snapshot], None]


# ----------------------------------------------------------------------------------------------
# Live progress: one status line, about once a second
# ----------------------------------------------------------------------------------------------

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

    def close(self) -> None:
        if self.width:
            self.stream.write("\r" + " " * self.width + "\r")
            self.stream.flush()


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


# ----------------------------------------------------------------------------------------------
# Echoing the ranks' output (``stream=True``)
# ----------------------------------------------------------------------------------------------

class _Echo:
    def __init__(self, run_dir: Path, before_line: Callable[[], None] | None = None):
        self.run_dir, self.offsets, self.before_line = run_dir, {}, before_line

    def __call__(self) -> None:
        for rank, path in evidence.rank_logs(self.run_dir):
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


# ----------------------------------------------------------------------------------------------
# The entry point
# ----------------------------------------------------------------------------------------------

def run(target: str | int | os.PathLike, variant: str | None = None, nproc: int | None = None,
        deadline_s: float | None = None, args: Sequence[str] = (), env: Mapping[str, str] | None = None,
        port: int | None = 0, stream: bool = False, run_root: str | Path | None = None,
        grace_s: float = GRACE_S, stall_s: float | None = None,
        progress: Progress | str | None = "auto", cluster=None, check: bool = False) -> RunResult:
    """Run a lab (number or name) or any torchrun-able script on ``nproc`` local ranks.

    Returns a RunResult whose ``status`` is "ok", "failed" (a rank exited with an error), "hung"
    (every live rank made no progress for ``stall_s`` seconds: evidence read, job ended),
    "deadline" (still making progress at the optional outer limit ``deadline_s``) or "interrupted"
    (a KeyboardInterrupt: the job is ended the same way, the result saved, then it propagates).
    ``progress``: "auto" (a status line on a terminal or in Jupyter), None, or a callable that gets
    a ``supervise.Snapshot`` about once a second.
    ``cluster``: a ``ddplab.origins.cluster.Cluster`` (entered): a multi-node job, ``nproc`` ranks on each of
    its nodes (one torchrun agent per node). A lab whose LAB dict names a ``network`` for the variant
    gets a cluster of its own, made and removed around the run.
    ``check``: compare what each rank recorded about its replicas, gradients and data after the run
    (``result.check``, a ``ddplab.engine.check.CheckReport``), with no collective added to the job.
    """
    # the lab is looked up once, here (job.lab)
    job = resolve(target, variant, nproc, deadline_s, tuple(args), port, env=env,
                  run_root=Path(run_root) if run_root else None, stall_s=stall_s, check=check)
    spec = (job.lab.extra.get("network") or {}).get(job.variant) if job.lab is not None else None
    if cluster is None and spec is not None:
        from ddplab.origins import cluster as cluster_mod
        with cluster_mod.Cluster.from_spec(spec) as made:
            return _turn(replace(job, env={**spec.get("env", {}), **job.env}), stream, grace_s, progress, made)
    return _turn(job, stream, grace_s, progress, cluster)


def _turn(job: Job, stream, grace_s, progress, cluster) -> RunResult:
    measured = job.lab is not None and job.lab.variant(job.variant).measured is not None
    # make workbook: a run that measures times has the machine alone; its job starts at once, its
    # ranks wait (ddplab.rank.lab) until the runs in progress have ended
    with turns.turn(alone=measured, early=True) as turn:
        return _run(job, stream, grace_s, progress, cluster, turn)


def _run(job: Job, stream, grace_s, progress, cluster, turn: turns.Turn) -> RunResult:
    job.run_dir.mkdir(parents=True, exist_ok=True)
    (job.run_dir / runfiles.RANKS).mkdir(exist_ok=True)
    socket_dir(job.run_dir).mkdir(parents=True, exist_ok=True)
    world = cluster.ranks(job.nproc) if cluster is not None else job.nproc
    cmd, penv, spec = build_command(job, cluster)
    if spec is not None:
        (job.run_dir / runfiles.CLUSTER).write_text(json.dumps(spec, indent=2))
    go = None if turn.ready() else job.run_dir / runfiles.MACHINE_GO   # created once the machine is the run's
    if go is not None:
        penv[turns.GO_ENV] = f"{go} {os.getpid()}"
    show = auto_progress() if progress == "auto" else progress
    echo = _Echo(job.run_dir, before_line=getattr(show, "close", None) if isinstance(show, TerminalProgress) else None) \
        if stream else None

    with open(job.run_dir / runfiles.TORCHRUN_LOG, "wb") as console:
        # Own session: Ctrl-C in a terminal does not reach torchrun directly; ddplab ends it below.
        # A single-node job's agent is forked from a process that imported torch already (ddplab.origins.warm:
        # the first run may wait for that import, which is neither the job's time nor a stall).
        proc = warm.start(cmd, penv, console)
    t0 = time.monotonic()   # the job's clock starts with its agent
    # which agent ran it: forked warm (its parent: ddplab.origins.warm's process) or started cold
    (job.run_dir / runfiles.COMMAND).write_text(json.dumps(
        {"command": cmd, "env": dict(job.env), "agent_pid": proc.pid,
         "warm_parent": proc.server.proc.pid if isinstance(proc, warm.WarmProcess) else None}, indent=2))
    sup = Supervisor(proc, job.run_dir, world, job.stall_s, t0)

    def tick(now: float) -> None:
        nonlocal go
        if go is not None:
            # waiting for its turn is not a stall: the stall window starts when the ranks may go
            sup.job_progress = now
            if turn.ready():
                go.touch()
                go = None
        if echo:
            echo()

    ended_by = None
    try:
        ended_by = watch(sup, limit_s=job.deadline_s, limit="deadline", on_tick=tick, show=show)
    finally:
        if isinstance(show, TerminalProgress):
            show.close()
        result = _result(job, cmd, sup, ended_by, grace_s)
        if echo:
            echo()
        if isinstance(show, NotebookProgress):
            show.close(result)
    if ended_by == "interrupt":
        print(f"ddplab: interrupted; the job was ended and its evidence saved in {short_path(result.run_dir)}", file=sys.stderr)
        raise KeyboardInterrupt
    return result


def _result(job: Job, cmd: list[str], sup: Supervisor, ended_by: str | None, grace_s: float) -> RunResult:
    """End every process (live evidence read first: Supervisor.end), collect the evidence, judge, and
    save the result with what only ``run`` knows (the job's target, command and port)."""
    seen, live = sup.end(ended_by, grace_s)
    if not seen.leftover:   # the ranks' worker-server sockets went with them; their folder would be left in /tmp
        shutil.rmtree(socket_dir(job.run_dir), ignore_errors=True)
    ev = evidence.collect(seen, live, job.run_dir)
    v = classify.judge(ev)
    master = next((i for i in ev.run.infos.values() if i.get("master_port")), None)
    result = RunResult(
        target=job.target, variant=job.variant, nproc=seen.world, wall_s=seen.wall_s,
        run_dir=str(job.run_dir), command=tuple(cmd), stall_s=job.stall_s, deadline_s=job.deadline_s,
        port=int(master["master_port"]) if master else (job.port or None), returncode=seen.returncode,
        leftover=seen.leftover, notes=seen.notes, **v.fields(),
        check=check_mod.compare(job.run_dir, seen.world) if job.check else None)
    result.save()
    timeline.save_later(result)     # timeline.png of a hung or failed run, drawn on a thread of its own
    return result
