"""``ddplab attach PID``: diagnose a running torchrun job that ddplab did not start.

The same pipeline as ``ddplab.run`` without the start: find torchrun and every local rank through
the process tree (PID may be torchrun's or any rank's), watch their progress for the stall window
(CPU time, stacks, the collective ledger where it can be read), then classify and render the
evidence the same way. The job keeps running unless ``stop=True``.

What can be read from outside a job that was not started by ddplab:
  * stacks: py-spy (needs ptrace rights: root, or ptrace_scope=0 on Linux);
  * the ledger (torch's flight recorder): through a worker server when the ranks run one (ddplab's
    rank hook, or torch's ``control_plane.worker_main`` with ``TORCH_WORKER_SERVER_SOCKET``); a job
    that only set ``TORCH_FR_BUFFER_SIZE`` records it but has no door to read it from outside.
"""
from __future__ import annotations

import os
import signal
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path

import psutil

from . import classify, evidence, stacks
from .errors import DdplabError
from .job import DEFAULT_STALL_S, new_run_dir, runs_root, seconds
from .result import RunResult
from .supervise import GRACE_S, POLL_S, RankWatch, Supervisor, _alive

DEFAULT_WATCH_S = 20.0      # give up watching a job that keeps making progress after this long


def _is_torchrun(p: psutil.Process) -> bool:
    cmd = _cmdline(p)
    return any(os.path.basename(c) == "torchrun" for c in cmd[:2]) or \
        any(c in ("torch.distributed.run", "ddplab._torchrun", "torch.distributed.launch") for c in cmd[:4])


def _cmdline(p: psutil.Process) -> list[str]:
    try:
        return p.cmdline()
    except psutil.Error:
        return []


def _is_warm_parent(p: psutil.Process) -> bool:
    """ddplab.warm's process (its forked agents share its command line; their parent is it)."""
    cmd = _cmdline(p)
    if "--warm" not in cmd[3:5]:
        return False
    try:
        parent = p.parent()
    except psutil.Error:
        return True
    return parent is None or _cmdline(parent) != cmd


def _env(p: psutil.Process) -> dict:
    try:
        return p.environ()
    except psutil.AccessDenied:
        raise DdplabError(f"cannot read the environment of pid {p.pid} (another user's process)",
                          hint="run ddplab attach as that user, or as root") from None
    except psutil.Error:
        return {}


def _is_rank(p: psutil.Process) -> bool:
    env = _env(p)
    return "RANK" in env and "LOCAL_RANK" in env and ("TORCHELASTIC_RUN_ID" in env or "GROUP_RANK" in env)


def _is_rank_or_say(p: psutil.Process) -> bool:
    try:
        return _is_rank(p)
    except DdplabError:
        if _is_torchrun(p):
            raise
        raise DdplabError(f"pid {p.pid} is {_describe(p)}, not a torchrun job or one of its ranks that ddplab can read "
                          "(its environment is not readable)",
                          hint="pass the pid of torchrun or of a rank that you own") from None


def _describe(p: psutil.Process) -> str:
    try:
        cmd = " ".join(p.cmdline())[:80] or p.name()
    except psutil.Error:
        cmd = "?"
    return f"{p.name()} ({cmd})"


@dataclass(frozen=True)
class Found:
    agent: psutil.Process | None           # torchrun (None if the ranks' parent is not torchrun)
    ranks: dict[int, psutil.Process]       # global rank -> process (this machine's ranks)
    world_size: int | None


def find_job(pid: int) -> Found:
    """torchrun and its ranks from a pid of either; DdplabError naming what the pid is otherwise."""
    try:
        p = psutil.Process(pid)
        p.status()
    except psutil.NoSuchProcess:
        raise DdplabError(f"no process with pid {pid}", hint="pass the pid of torchrun or of one rank (see `ps -ef | grep torchrun`)") from None
    agent = None
    if _is_torchrun(p):
        agent = p
    elif _is_rank_or_say(p):
        parent = p.parent()
        while parent is not None and not _is_torchrun(parent):
            parent = parent.parent()
        agent = parent
    else:
        raise DdplabError(f"pid {pid} is {_describe(p)}, not a torchrun job or one of its ranks",
                          hint="pass the pid of torchrun or of a rank (a process with RANK and LOCAL_RANK in its environment)")
    if agent is p and _is_warm_parent(p):
        raise DdplabError(f"pid {pid} is ddplab's warm process, which forks each run's torchrun agent; it runs no ranks",
                          hint="pass the pid of one of its children (an agent) or of a rank")
    candidates = agent.children(recursive=False) if agent is not None else [p]
    ranks, world = {}, None
    for c in candidates:
        try:
            env = _env(c)
        except DdplabError:
            raise
        if "RANK" in env and "LOCAL_RANK" in env and _alive(c):
            ranks[int(env["RANK"])] = c
            world = int(env.get("WORLD_SIZE", 0)) or world
    if not ranks:
        raise DdplabError(f"pid {pid} is torchrun, but it has no running ranks (still starting, or already finished)",
                          hint="try again in a few seconds, or check torchrun's output")
    return Found(agent, ranks, world)


def _socket_of(env: dict) -> str | None:
    """The rank's worker-server socket, if it runs one: ddplab's rank hook, or torch's worker_main."""
    if env.get("DDPLAB_SOCKET_DIR") and env.get("RANK") is not None:
        path = os.path.join(env["DDPLAB_SOCKET_DIR"], f"r{env['RANK']}.sock")
        if os.path.exists(path):
            return path
    path = env.get("TORCH_WORKER_SERVER_SOCKET")
    return path if path and os.path.exists(path) else None


class _AttachedSupervisor(Supervisor):
    """The poll loop over processes found, not started: ranks from the tree, stacks from py-spy
    when no worker server answers."""

    def __init__(self, found: Found, stall_s: float, t0: float, run_dir: Path):
        self.found = found
        root = found.agent or next(iter(found.ranks.values()))
        self.root = root
        # Supervisor reads proc.pid and, in terminate(), proc.poll()/wait(); give it a stand-in.
        super().__init__(_Proc(root), run_dir, len(found.ranks), stall_s, t0)
        self.known[root.pid] = root
        for rank, proc in found.ranks.items():
            env = _env(proc)
            self.known[proc.pid] = proc
            self.ranks[rank] = RankWatch(rank, proc.pid, _socket_of(env), proc, t0)

    def _discover(self, now: float) -> None:  # the ranks are known; only their children change
        for p in list(self.known.values()):
            try:
                for c in p.children(recursive=True):
                    self.known.setdefault(c.pid, c)
            except psutil.Error:
                pass

    def _stack(self, w: RankWatch):
        frames = super()._stack(w)
        if frames is None:
            frames, _ = stacks.pyspy_dump(w.pid)
        return frames

    def terminate(self, grace_s: float = GRACE_S) -> tuple[int, ...]:
        """--stop: SIGTERM to torchrun and every rank (each in its own session), then SIGKILL."""
        procs = self.alive_processes()
        for p in procs:
            try:
                p.send_signal(signal.SIGTERM)
            except psutil.Error:
                pass
        _, alive = psutil.wait_procs(procs, timeout=grace_s)
        for p in alive:
            try:
                p.kill()
            except psutil.Error:
                pass
        psutil.wait_procs(alive, timeout=2)
        self._discover(time.monotonic())
        return tuple(p.pid for p in self.alive_processes())


class _Proc:
    """The part of subprocess.Popen the supervisor uses, for a process that is not our child."""

    def __init__(self, p: psutil.Process):
        self.pid, self._p, self.returncode = p.pid, p, None

    def poll(self):
        return None if _alive(self._p) else 0

    def wait(self, timeout=None):
        try:
            self._p.wait(timeout)
        except psutil.Error:
            pass
        return 0


def attach(pid: int, stall_s: float | None = None, watch_s: float = DEFAULT_WATCH_S, stop: bool = False,
           progress=None) -> RunResult:
    """Watch the job for up to ``watch_s`` seconds: "hung" once every rank made no progress for
    ``stall_s``; "running" if it kept making progress; evidence read either way."""
    stall_s = seconds(DEFAULT_STALL_S if stall_s is None else stall_s, "--stall", "for example --stall 3")
    found = find_job(pid)
    run_dir = new_run_dir(runs_root() / "attach", f"pid{pid}")
    (run_dir / "ranks").mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    sup = _AttachedSupervisor(found, stall_s, t0, run_dir)
    ended_by = None
    try:
        while True:
            now = time.monotonic()
            sup.poll()
            if progress is not None:
                progress(sup.snapshot(now))
            if not sup.live():
                ended_by = "exited"
                break
            if sup.stalled(now):
                ended_by = "stall"
                break
            if now - t0 >= max(watch_s, stall_s + 1):
                ended_by = "watched"
                break
            time.sleep(POLL_S * 4)
    except KeyboardInterrupt:
        ended_by = "interrupt"
        raise
    finally:
        result = _finish(pid, found, sup, ended_by, t0, stop, run_dir)
    return result


def _finish(pid: int, found: Found, sup: _AttachedSupervisor, ended_by: str | None, t0: float, stop: bool,
            run_dir: Path) -> RunResult:
    live = sup.capture(Path(tempfile.gettempdir()))
    notes = []
    if not any(w.sock for w in sup.ranks.values()):
        notes.append("the ranks run no worker server, so their collective ledgers cannot be read from outside "
                     "(start the job with `ddplab run`, or wrap main in torch.distributed.elastic.control_plane."
                     "worker_main() with TORCH_WORKER_SERVER_SOCKET and TORCH_FR_BUFFER_SIZE set)")
    notes += [f"rank {lv.rank}: {lv.note}" for lv in live.values() if lv.note and not lv.frames]
    if found.world_size and found.world_size > len(found.ranks):
        notes.append(f"only this machine's {len(found.ranks)} of {found.world_size} ranks were seen")
    leftover: tuple[int, ...] = ()
    if stop:
        leftover = sup.terminate()
        notes.append("the job was stopped (--stop)")
    else:
        notes.append("the job was left running (pass --stop to end it)")
    ev = evidence.RunEvidence(infos={r: {"pid": w.pid} for r, w in sup.ranks.items()}, errors={}, exits={},
                              torchrun=None, logs={}, fatal={}, console="")
    ledgers = sup.ledgers(live)
    verdict_by = {"stall": "stall", "interrupt": "interrupt"}.get(ended_by or "", "watched")
    nranks = max(found.ranks) + 1
    v = classify.verdict(nranks, verdict_by, None, ev, live, ledgers, {r: w.cpu_s for r, w in sup.ranks.items()}, {})
    ranks = tuple(r if stop else replace(r, signal=None) for r in v.ranks if r.rank in found.ranks)
    now = time.monotonic()
    stall = sup.stall_facts(now, ranks) if ended_by == "stall" else None
    status = {"stall": "hung", "interrupt": "interrupted", "exited": "exited"}.get(ended_by or "", "running")
    cmd = ()
    try:
        cmd = tuple((found.agent or next(iter(found.ranks.values()))).cmdline())
    except psutil.Error:
        pass
    result = RunResult(target=f"pid {pid}", variant=None, nproc=len(found.ranks), status=status,
                       signature=v.signature if status in ("hung", "interrupted") else None, excerpt=None,
                       ranks=ranks, wall_s=round(now - t0, 3), run_dir=str(run_dir), command=cmd,
                       stall_s=sup.stall_s, leftover=leftover, notes=tuple(notes), stall=stall,
                       divergence=v.divergence, attached_pid=pid)
    result.save()
    return result
