"""Run a job and judge it: the one entry point (``ddplab.run``), wiring the seams together.

    job (ddplab.job)           what to run: resolved input, the torchrun command, the ranks' environment
    supervise (ddplab.supervise)  one poll loop: each rank's progress (CPU, ledger, stack); the stall rule
    evidence (ddplab.evidence) what the ranks did: stacks, ledgers, exception and exit records
    classify (ddplab.classify) pure functions from evidence to status, signature and per-rank facts
    render (ddplab.render)     sentences, HTML and the live status line, made only when shown

A job is *hung* when every live rank has made no progress for the stall window (progress is
evidence from the ranks, never the clock); ``deadline_s`` is only an optional outer limit. Whatever
happens (an exit, a stall, the deadline, Ctrl-C, a Jupyter interrupt, SIGTERM), every process of the
job is ended and checked gone before ``run`` returns.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Mapping, Sequence

from . import catalog, classify, evidence, render, turns, warm
from .job import (DEFAULT_SCRIPT_DEADLINE_S, DEFAULT_STALL_S, HOOK_DIR, Job, build_cluster_command,  # noqa: F401
                  build_launch_command,
                  launch_environment, max_nproc, resolve, runs_root, socket_dir)
from . import check as check_mod
from .result import RunResult
from .supervise import GRACE_S, POLL_S, Snapshot, Supervisor

PROGRESS_EVERY_S = 1.0
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
    ``cluster``: a ``ddplab.cluster.Cluster`` (entered): a multi-node job, ``nproc`` ranks on each of
    its nodes (one torchrun agent per node). A lab whose LAB dict names a ``network`` for the variant
    gets a cluster of its own, made and removed around the run.
    ``check``: compare what each rank recorded about its replicas, gradients and data after the run
    (``result.check``, a ``ddplab.check.CheckReport``), with no collective added to the job.
    """
    lab = None if isinstance(target, os.PathLike) else catalog.find_lab(target)
    spec = (lab.extra.get("network") or {}).get(variant or lab.default_variant) if lab is not None else None
    if cluster is None and spec is not None:
        from . import cluster as cluster_mod
        with cluster_mod.Cluster.from_spec(spec) as made:
            return run(target, variant, nproc, deadline_s, args, {**spec.get("env", {}), **dict(env or {})}, port,
                       stream, run_root, grace_s, stall_s, progress, cluster=made, check=check)
    measured = lab is not None and lab.variant(variant or lab.default_variant).measured is not None
    # make workbook: a run that measures times has the machine alone; its job starts at once, its
    # ranks wait (ddplab.lab) until the runs in progress have ended
    with turns.turn(alone=measured, early=True) as turn:
        return _run(target, variant, nproc, deadline_s, args, env, port, stream, run_root, grace_s, stall_s,
                    progress, cluster, turn, check)


def _run(target, variant, nproc, deadline_s, args, env, port, stream, run_root, grace_s, stall_s, progress,
         cluster, turn: turns.Turn, check: bool = False) -> RunResult:
    job = resolve(target, variant, nproc, deadline_s, tuple(args), port, env=env,
                  run_root=Path(run_root) if run_root else None, stall_s=stall_s, check=check)
    job.run_dir.mkdir(parents=True, exist_ok=True)
    (job.run_dir / "ranks").mkdir(exist_ok=True)
    socket_dir(job.run_dir).mkdir(parents=True, exist_ok=True)
    world = job.nproc * (len(cluster.members) if cluster is not None else 1)
    penv = launch_environment(job)
    if cluster is None:
        cmd = build_launch_command(job)
    else:
        cmd, spec = build_cluster_command(job, cluster)
        (job.run_dir / "cluster.json").write_text(json.dumps(spec, indent=2))
        # The host's interface names mean nothing on a node: gloo's interface is the job's choice.
        penv.pop("GLOO_SOCKET_IFNAME", None)
        penv.update({k: v for k, v in job.env.items() if k == "GLOO_SOCKET_IFNAME"})
        if "OMP_NUM_THREADS" not in os.environ and "OMP_NUM_THREADS" not in job.env:
            penv["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // world))
    go = None if turn.ready() else job.run_dir / "machine.go"   # created once the machine is the run's
    if go is not None:
        penv[turns.GO_ENV] = f"{go} {os.getpid()}"
    show = auto_progress() if progress == "auto" else progress
    echo = _Echo(job.run_dir, before_line=getattr(show, "close", None) if isinstance(show, TerminalProgress) else None) \
        if stream else None

    with open(job.run_dir / "torchrun.log", "wb") as console:
        # Own session: Ctrl-C in a terminal does not reach torchrun directly; ddplab ends it below.
        # A single-node job's agent is forked from a process that imported torch already (ddplab.warm:
        # the first run may wait for that import, which is neither the job's time nor a stall).
        proc = warm.start(cmd, penv, console)
    t0 = time.monotonic()   # the job's clock starts with its agent
    # which agent ran it: forked warm (its parent: ddplab.warm's process) or started cold
    (job.run_dir / "command.json").write_text(json.dumps(
        {"command": cmd, "env": dict(job.env), "agent_pid": proc.pid,
         "warm_parent": proc.server.proc.pid if isinstance(proc, warm.WarmProcess) else None}, indent=2))
    sup = Supervisor(proc, job.run_dir, world, job.stall_s, t0)
    ended_by: str | None = None
    result: RunResult | None = None
    shown = 0.0
    try:
        while proc.poll() is None:
            now = time.monotonic()
            sup.poll()
            if go is not None:
                # waiting for its turn is not a stall: the stall window starts when the ranks may go
                sup.job_progress = now
                if turn.ready():
                    go.touch()
                    go = None
            if echo:
                echo()
            if show is not None and now - shown >= PROGRESS_EVERY_S:
                shown = now
                show(sup.snapshot(now))
            if job.deadline_s is not None and now - t0 >= job.deadline_s:
                ended_by = "deadline"
                break
            if sup.stalled(now):
                ended_by = "stall"
                break
            time.sleep(POLL_S)
    except KeyboardInterrupt:
        ended_by = "interrupt"
        raise
    finally:
        if isinstance(show, TerminalProgress):
            show.close()
        result = _finish(job, cmd, proc, sup, ended_by, t0, grace_s, world)
        if echo:
            echo()
        if isinstance(show, NotebookProgress):
            show.close(result)
        if ended_by == "interrupt":
            print(f"ddplab: interrupted; the job was ended and its evidence saved in {result.run_dir}", file=sys.stderr)
    return result


def _finish(job: Job, cmd: list[str], proc: subprocess.Popen, sup: Supervisor, ended_by: str | None,
            t0: float, grace_s: float, world: int | None = None) -> RunResult:
    """Read the live evidence (if the job was stopped), end every process, classify, save."""
    notes: list[str] = []
    live: dict = {}
    now = time.monotonic()
    if ended_by is not None:
        live = sup.capture(job.run_dir)
        notes += [f"rank {lv.rank}: {lv.note}" for lv in live.values() if lv.note and lv.source != "py-spy"]
    leftover = sup.terminate(grace_s) if (ended_by is not None or sup.alive_processes()) else ()
    if leftover:
        notes.append(f"processes still alive after cleanup: {list(leftover)}")
    else:   # the ranks' worker-server sockets went with them; their folder would be left in /tmp
        shutil.rmtree(socket_dir(job.run_dir), ignore_errors=True)
    returncode = proc.returncode if ended_by is None else None
    ev = evidence.read_run(job.run_dir)
    ledgers = sup.ledgers(live, ev.final_ledgers)
    cpu = {r: round(w.cpu_s, 3) for r, w in sup.ranks.items()}
    world = world or job.nproc
    records = {r: evidence.records(job.run_dir, r) for r in range(world)}
    v = classify.verdict(world, ended_by, returncode, ev, live, ledgers, cpu, records)
    stall = sup.stall_facts(now, v.ranks) if ended_by == "stall" else None
    master = next((i for i in ev.infos.values() if i.get("master_port")), None)
    result = RunResult(
        target=job.target, variant=job.variant, nproc=world, status=v.status, signature=v.signature,
        excerpt=v.excerpt, ranks=v.ranks, wall_s=round(time.monotonic() - t0, 3), run_dir=str(job.run_dir),
        command=tuple(cmd), stall_s=job.stall_s, deadline_s=job.deadline_s,
        port=int(master["master_port"]) if master else (job.port or None), returncode=returncode,
        leftover=leftover, notes=tuple(notes), first_failure=v.first_failure, stall=stall, divergence=v.divergence,
        check=check_mod.compare(job.run_dir, world) if job.check else None)
    result.save()
    return result
