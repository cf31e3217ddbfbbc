"""Supervision: the one watch loop (``watch``) over a job, the stall rule, and ending the job.

Every live origin goes through the same loop (``ddplab.engine.diagnose``): a job ddplab started
(``Supervisor``: torchrun is its child, the ranks are found from their hook's records) or processes
found in the process tree (``FoundSupervisor``, for ``ddplab attach``), with an outer limit
(``Ending.DEADLINE``) or a watch time (``Ending.WATCHED``). Both are built from plain data (a
process, pids, sockets) and the loop calls nothing of the origin that made them. At the end
``Supervisor.end`` captures the live ranks and ends the job (or leaves it running), and returns what
the loop saw as data (``evidence.Watch``). Nothing here classifies.

Progress is evidence from the ranks, never the clock: a rank makes progress when its CPU time grows
(with its child processes: DataLoader workers), when its collective ledger moves (torch's flight
recorder, read through the rank's worker server), or when its stack changes. A job is *stalled*
when every live rank has made no progress for the stall window. A rank computing, importing torch
or loading data on a loaded machine is slow, not stuck, however long it takes.

A rank with a thread that is runnable (or in uninterruptible I/O) on two samples in a row is
waiting for a core, not for its peers: on an overloaded machine it may gain no CPU time for seconds,
and that is progress owed, not a stall. So is a rank whose TCP traffic moves while the rank does not
(``network_moved``): on a lossy link a lost segment is resent after a timeout that doubles each time
it is lost again, and the receiver's window can close while it holds segments out of order, so a
collective can sit for seconds with a few KB acknowledged at a time, then go on (lab 09's 5 % lossy
link was judged hung in CI, under load). Only a change counts: in a hang the queues stand still.
So is a rank whose main thread comes to sleep in a kernel wait it has not slept in before
(``/proc/PID/wchan``, read with no probe and no GIL): it left the wait it was in, as lab 06's
late-rank rank 0 does when its rendezvous times out (``poll_schedule_timeout`` to
``hrtimer_nanosleep`` in its linger) while every probe of its stack may time out on a loaded
machine. Only a new one counts: a loop that polls and sleeps goes back to waits already seen.

Two things hold a stall verdict back, both read from the ranks: a rank that has just started or
exited (a change of state is progress), and PyTorch's own timeout about to fire. When a blocked
collective (its ledger entry carries ``timeout_ms``) or a rendezvous (the timeout argument of the
frame it waits in) will time out within ``TIMEOUT_PATIENCE_S``, the verdict waits for PyTorch's
own error, which is what the learner would meet.

The loop is torch's ``MultiProcessTestCase._join_processes`` shape: poll, check, sleep, with every
process of the job (found through the tree: torchrun starts each worker in its own session)
ended on any way out.
"""
from __future__ import annotations

import os
import signal
import subprocess
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import psutil

from ddplab.engine import evidence, probe, stacks
from ddplab.engine import ledger as ledger_mod
from ddplab.result import Snapshot
from ddplab.defaults import CPU_PROGRESS_CORES, GRACE_S, TIMEOUT_GRACE_S, TIMEOUT_PATIENCE_S, Ending  # noqa: F401

POLL_S = 0.05                 # how often the loop checks the job's end
PROGRESS_EVERY_S = 1.0        # how often the live status line is shown
SAMPLE_S = 0.25               # how often the ranks are sampled (CPU)
LEDGER_EVERY_S = 0.5          # how often each rank's ledger is read
STACK_EVERY_S = 1.0           # how often an idle rank's stack is fingerprinted
CPU_WINDOW_S = 1.0
# A TCPStore client that cannot connect retries once after its timeout (torch 2.13: "retrying (try=0,
# timeout=..., delay=...)"), so it raises after about 2-2.5x the timeout it was given (measured: 3 s ->
# 5.7-7.2 s, 8 s -> 19.5 s). A rendezvous timeout is expected to fire within this multiple of it.
RDZV_TIMEOUT_FACTOR = 2.5
RDZV_PROBE_PATIENCE_S = 3.0  # how long a rank's worker server may take to say where it dials, at a verdict


def _alive(p: psutil.Process) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _tree(p: psutil.Process) -> list[psutil.Process]:
    """A rank and its children (DataLoader workers), as far as they can be read."""
    try:
        return [p] + p.children(recursive=True)
    except psutil.Error:
        return [p]


def waiting_for_cpu(p: psutil.Process) -> bool:
    """Some thread of the rank (or of its children) is runnable or in uninterruptible I/O (Linux
    state R or D): the kernel owes it time. On a loaded machine such a rank may gain no CPU time for
    seconds, yet it is not blocked on its peers. Linux reads /proc; elsewhere the process state."""
    for q in _tree(p):
        try:
            tasks = os.listdir(f"/proc/{q.pid}/task")
        except OSError:
            try:
                if q.status() in (psutil.STATUS_RUNNING, psutil.STATUS_DISK_SLEEP):
                    return True
            except psutil.Error:
                pass
            continue
        for tid in tasks:
            try:
                with open(f"/proc/{q.pid}/task/{tid}/stat", "rb") as f:
                    state = f.read().rsplit(b")", 1)[1].split(None, 1)[0]
            except (OSError, IndexError):
                continue
            if state in (b"R", b"D"):
                return True
    return False


# After this many timeouts of one segment in a row (0.2 s doubling: 6 s at least) the peer is taken as
# gone or cut off, not slow: a wait on it is no longer progress owed.
MAX_RETRANSMITS = 4


def tcp_queues(p: psutil.Process) -> dict[str, tuple[int, int, int]]:
    """The TCP queues of the rank and its children (``evidence.tcp_queues``)."""
    return evidence.tcp_queues(p.pid, [q.pid for q in _tree(p)])


def network_moved(before: dict, now: dict) -> bool:
    """The rank's TCP traffic is moving, though the rank itself is not: on a connection seen at both
    looks the bytes in flight or unread changed (a lossy link acknowledging slowly, a window
    reopening), or the kernel is resending bytes it timed out on (at least once and at most
    MAX_RETRANSMITS times in a row: between two resends nothing changes for up to twice the last
    wait). In a hang every queue stands still (empty, or full towards a peer that does not read), and
    so can a few bytes the kernel holds with its timer armed but never resent (seen: 9 bytes on rank
    0's own store connection, for minutes): a timer alone is not movement."""
    for inode, (tx, rx, resent) in now.items():
        if 1 <= resent <= MAX_RETRANSMITS:
            return True
        was = before.get(inode)
        if was is not None and (tx or rx) and (tx, rx) != was[:2]:
            return True
    return False


def new_wait(seen: set, wchan: str | None) -> bool:
    """Record the kernel wait the rank's main thread sleeps in; True when it is one it had not slept
    in before, after at least one other (the rank moved on from a wait). None (running, or not
    Linux) changes nothing."""
    if wchan is None:
        return False
    wait = wchan.split(".", 1)[0]          # "poll_schedule_timeout.constprop.0"
    if wait in seen:
        return False
    seen.add(wait)
    return len(seen) > 1


def _cpu_moved(samples: deque, now: float, cpu: float) -> bool:
    """CPU use over the last CPU_WINDOW_S (over all the samples there are, when they span less and
    at least SAMPLE_S: a stall window shorter than CPU_WINDOW_S must still see a starting job's CPU)
    above CPU_PROGRESS_CORES."""
    before = next(((t, c) for t, c in reversed(samples) if now - t >= CPU_WINDOW_S), None)
    if before is None and samples and now - samples[0][0] >= SAMPLE_S:
        before = samples[0]
    return before is not None and (cpu - before[1]) >= CPU_PROGRESS_CORES * (now - before[0])


def recent_cores(samples: deque) -> float | None:
    """CPU cores a rank used over its last CPU_WINDOW_S of samples (the rule above, as a number):
    kept in the result, so a view can say whether the rank the others waited for was busy."""
    if len(samples) < 2:
        return None
    now, cpu = samples[-1]
    before = next(((t, c) for t, c in reversed(samples) if now - t >= CPU_WINDOW_S), samples[0])
    return round((cpu - before[1]) / (now - before[0]), 3) if now > before[0] else None


@dataclass
class RankWatch:
    """What the loop knows about one rank as it runs."""
    rank: int
    pid: int
    sock: str | None
    proc: psutil.Process | None
    last_progress: float                         # monotonic; first seen counts as progress
    cpu: deque = field(default_factory=lambda: deque(maxlen=64))   # (t, cpu seconds)
    cpu_s: float = 0.0
    ledger: tuple = ()
    ledger_t: float = 0.0
    stack_fp: tuple | None = None
    stack_t: float = 0.0
    exited_at: float | None = None
    rdzv: dict | None = None                     # what its rendezvous handler last said
    rdzv_t: float = 0.0
    runnable_n: int = 0                          # consecutive samples with a runnable thread
    tcp: dict = field(default_factory=dict)      # its TCP queues at the last look (tcp_queues)
    waits: set = field(default_factory=set)      # the kernel waits its main thread has slept in
    issued: int = 0                              # collectives issued (ledger.issued), for a collective limit
    issued_t: float = 0.0

    @property
    def alive(self) -> bool:
        return self.exited_at is None

    def idle_s(self, now: float) -> float:
        return now - self.last_progress

    def pending(self):
        return ledger_mod.pending(self.ledger)


class Supervisor:
    """The job's processes and each rank's progress, sampled by ``poll()``."""
    # an outer limit counted in collectives, not seconds (a fix-it's limit from its reference run):
    # past it, the loop ends the job as it does at a deadline (the ranks were still making progress)
    max_collectives: int | None = None

    def __init__(self, proc: subprocess.Popen, run_dir: Path, nproc: int, stall_s: float, t0: float,
                 go_file: Path | None = None):
        self.proc, self.run_dir, self.nproc, self.stall_s, self.t0 = proc, run_dir, nproc, stall_s, t0
        # a job whose ranks wait for their turn (ddplab.origins.turns): until this file exists, their
        # waiting is not a stall (the stall window starts when they may go)
        self.go_file = go_file
        self.world = nproc               # ranks numbered 0..world-1 (attach: this machine's may be fewer)
        self.known: dict[int, psutil.Process] = {}
        try:
            self.known[proc.pid] = psutil.Process(proc.pid)
        except psutil.Error:
            pass
        self.ranks: dict[int, RankWatch] = {}
        self.last_sample = 0.0
        self.job_progress = t0          # last progress of the job as a whole
        self.agent_cpu: deque = deque([(t0, 0.0)], maxlen=64)   # torchrun has used no CPU at its launch
        self.waited_for_timeout_s: float | None = None
        self.wall_offset = time.time() - time.monotonic()

    # --- sampling ------------------------------------------------------------------------------
    def poll(self, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self.last_sample < SAMPLE_S:
            return
        self.last_sample = now
        if self.go_file is not None:
            if os.path.exists(self.go_file):
                self.go_file = None
            else:
                self.job_progress = now
        self._discover(now)
        for w in self.ranks.values():
            if w.alive:
                self._sample_rank(w, now)
        if len(self.ranks) < self.nproc:
            self._sample_agent(now)
        for w in self.ranks.values():
            self.job_progress = max(self.job_progress, w.last_progress)

    def _discover(self, now: float) -> None:
        root = self.known.get(self.proc.pid)
        if root is not None:
            try:
                for p in root.children(recursive=True):
                    self.known.setdefault(p.pid, p)
            except psutil.Error:
                pass
        if len(self.ranks) < self.nproc:
            for rank, info in evidence.rank_infos(self.run_dir).items():
                if rank in self.ranks:
                    continue
                pid = int(info["pid"])
                proc = self.known.get(pid)
                if proc is None:
                    try:
                        proc = psutil.Process(pid)
                        self.known[pid] = proc
                    except psutil.Error:
                        proc = None
                self.ranks[rank] = RankWatch(rank, pid, info.get("socket"), proc, now)

    def _tree_cpu(self, p: psutil.Process) -> float:
        total = 0.0
        for q in _tree(p):
            try:
                t = q.cpu_times()
                total += t.user + t.system
            except psutil.Error:
                pass
        return total

    def _sample_rank(self, w: RankWatch, now: float) -> None:
        if w.proc is None or not _alive(w.proc):
            w.exited_at = now
            w.last_progress = now      # a rank leaving changes the job's state
            return
        cpu = self._tree_cpu(w.proc)
        w.cpu_s = max(w.cpu_s, cpu)
        w.cpu.append((now, cpu))
        if _cpu_moved(w.cpu, now, cpu):
            w.last_progress = now
            return
        # Runnable on two samples in a row (a thread answering our own probe is not, for that long):
        # starved of a core by other work, not stuck on its peers.
        w.runnable_n = w.runnable_n + 1 if waiting_for_cpu(w.proc) else 0
        if w.runnable_n >= 2:
            w.last_progress = now
            return
        if new_wait(w.waits, stacks.read_wchan(w.pid)):
            w.last_progress = now
            return
        if w.idle_s(now) >= SAMPLE_S:
            tcp = tcp_queues(w.proc)
            moved, w.tcp = network_moved(w.tcp, tcp), tcp
            if moved:
                w.last_progress = now
                return
        if w.sock and now - w.ledger_t >= LEDGER_EVERY_S:
            w.ledger_t = now
            dump = probe.ledger(w.sock, timeout_s=1.0)
            if dump is not None:
                new = ledger_mod.parse(dump)
                if ledger_mod.position(new) != ledger_mod.position(w.ledger):
                    w.last_progress = now
                w.ledger = new
        if w.idle_s(now) >= STACK_EVERY_S and now - w.stack_t >= STACK_EVERY_S:
            self._look(w, now)

    def _look(self, w: RankWatch, now: float) -> bool:
        """Fingerprint the rank's stack now; True (and progress) if it differs from the last one."""
        w.stack_t = now
        frames = self._stack(w)
        if frames is None:
            return False
        fp = tuple((f.file, f.line, f.func) for f in frames)
        moved = w.stack_fp is not None and fp != w.stack_fp
        if moved:
            w.last_progress = now
        w.stack_fp = fp
        return moved

    def _stack(self, w: RankWatch):
        """The main thread's frames through the worker server (no ptrace); None if not reachable."""
        if not w.sock:
            return None
        text = probe.traceback(w.sock, timeout_s=1.0)
        return stacks.parse_faulthandler_main(text) if text else None

    def _sample_agent(self, now: float) -> None:
        """Before every rank has started, torchrun (and ranks still importing) make the progress."""
        root = self.known.get(self.proc.pid)
        if root is None:
            return
        cpu = self._tree_cpu(root)
        self.agent_cpu.append((now, cpu))
        if _cpu_moved(self.agent_cpu, now, cpu):
            self.job_progress = now

    # --- the stall rule ----------------------------------------------------------------------------
    def live(self) -> list[RankWatch]:
        return [w for w in self.ranks.values() if w.alive]

    def past_limit(self, now: float) -> bool:
        """A rank has issued more collectives than ``max_collectives`` (its ledger read through its
        worker server every LEDGER_EVERY_S, busy or not: a rank that keeps computing is never idle)."""
        if self.max_collectives is None:
            return False
        for w in self.live():
            if w.sock and now - w.issued_t >= LEDGER_EVERY_S:
                w.issued_t = now
                dump = probe.ledger(w.sock, timeout_s=1.0)
                if dump is not None:
                    w.issued = max(w.issued, ledger_mod.issued(ledger_mod.parse(dump)))
        return any(w.issued > self.max_collectives for w in self.ranks.values())

    def idle_s(self, now: float) -> float:
        return now - self.job_progress

    def stalled(self, now: float) -> bool:
        """Every live rank without progress for the stall window (and no own timeout about to fire)."""
        live = self.live()
        if not live and self.ranks:
            return False                     # every rank exited: torchrun is finishing
        if self.idle_s(now) < self.stall_s:
            return False
        if self._looked_again(now):
            return False
        expiry = self._own_timeout(now)
        if expiry is not None:
            if now < expiry:
                return False
            self.waited_for_timeout_s = round(now - (self.job_progress + self.stall_s), 1)
        return True

    def _looked_again(self, now: float) -> bool:
        """Before a stall verdict, a fresh look at the stack of every live rank not looked at within
        SAMPLE_S: True (progress) if one changed since its last fingerprint. An idle rank's stack is
        sampled once a second through its worker server, and a probe that timed out on a loaded
        machine is a missed sample: notebook 06's missing-rank was judged hung while its ranks had
        left the rendezvous (raised, then slept in the lab's report) unseen."""
        moved = False
        for w in self.live():
            if now - w.stack_t >= SAMPLE_S and self._look(w, now):
                self.job_progress = max(self.job_progress, now)
                moved = True
        return moved

    def _own_timeout(self, now: float) -> float | None:
        """When PyTorch's own timeout of a blocked rank fires (monotonic), if within the patience."""
        soonest = None
        for w in self.live():
            ends = []
            p = w.pending()
            if p is not None and p.timeout_ms:
                ends.append(p.created_ns / 1e9 - self.wall_offset + p.timeout_ms / 1000)
            if w.sock and not w.ledger:
                # Read once more at every new idle period, with time to answer: a probe that timed out
                # on a loaded machine (or was last read before the rank moved) must not turn a
                # rendezvous that PyTorch will time out into a hang verdict. Within the same idle
                # period a failed read keeps what was read before (the rank has not moved).
                fresh = w.rdzv_t >= w.last_progress
                if now - w.rdzv_t >= 1.0 or not fresh:
                    got = probe.rendezvous_target(w.sock, timeout_s=1.0 if fresh else RDZV_PROBE_PATIENCE_S)
                    if got is not None or not fresh:
                        w.rdzv = got
                    w.rdzv_t = now
                if w.rdzv and w.rdzv.get("timeout_s"):
                    ends.append(w.last_progress + RDZV_TIMEOUT_FACTOR * float(w.rdzv["timeout_s"]))
            for end in ends:
                if end - now <= TIMEOUT_PATIENCE_S and (soonest is None or end < soonest):
                    soonest = end
        return None if soonest is None else soonest + TIMEOUT_GRACE_S

    def snapshot(self, now: float) -> Snapshot:
        rows = []
        for r in range(self.nproc):
            w = self.ranks.get(r)
            if w is None:
                rows.append({"rank": r, "state": "starting", "op": None, "seq": None, "idle_s": 0.0})
                continue
            if not w.alive:
                rows.append({"rank": r, "state": "exited", "op": None, "seq": None, "idle_s": 0.0})
                continue
            p = w.pending()
            idle = w.idle_s(now)
            if p is not None and idle >= SAMPLE_S * 2:
                rows.append({"rank": r, "state": "waiting", "op": p.op, "seq": p.seq, "idle_s": round(idle, 1)})
            else:
                rows.append({"rank": r, "state": "running", "op": None,
                             "seq": ledger_mod.last_completed(w.ledger), "idle_s": round(idle, 1)})
        idle = self.idle_s(now)
        return Snapshot(round(now - self.t0, 1), self.nproc, tuple(rows), round(idle, 1) if idle >= 1.0 else 0.0,
                        self.stall_s)

    # --- the verdict -------------------------------------------------------------------------------
    def capture(self, run_dir: Path) -> dict[int, "evidence.LiveRank"]:
        """Everything readable from each rank still alive, now (before the job is ended)."""
        self.poll(force=True)
        infos = {w.rank: {"pid": w.pid, "socket": w.sock} for w in self.live()}
        return evidence.capture_live(run_dir, infos, {r: w.ledger for r, w in self.ranks.items()})

    # --- the end -----------------------------------------------------------------------------------
    finished_as = Ending.FINISHED      # how watch() names a job that ended on its own

    def finished(self) -> bool:
        """The job ended on its own: torchrun exited."""
        return self.proc.poll() is not None

    def returncode(self) -> int | None:
        return self.proc.returncode

    def end(self, ended_by: Ending, grace_s: float = GRACE_S, stop: bool = True,
            capture_dir: Path | None = None) -> tuple["evidence.Watch", dict]:
        """At the verdict: the loop's facts (measured now), each live rank captured (if the job did not
        end on its own), then the job ended (``stop``; always for a job ddplab started)."""
        now = time.monotonic()
        on_its_own = ended_by in (Ending.FINISHED, Ending.EXITED)
        live = {} if on_its_own else self.capture(capture_dir or self.run_dir)
        notes = [f"rank {lv.rank}: {lv.note}" for lv in live.values() if lv.note and lv.source != "py-spy"]
        leftover: tuple[int, ...] = ()
        stopped_at = None
        if stop and (not on_its_own or self.alive_processes()):
            stopped_at = time.time()
            leftover = self.terminate(grace_s)
            if leftover:
                notes.append(f"processes still alive after cleanup: {list(leftover)}")
        watch = evidence.Watch(
            ended_by=ended_by, returncode=self.returncode() if on_its_own else None,
            # a rank numbered past the ranks started (nodes that disagree on WORLD_SIZE): 0..its number
            world=max(self.world, 1 + max(self.ranks, default=-1)), stall_s=self.stall_s,
            wall_s=round(time.monotonic() - self.t0, 3),
            idle_s=now - self.job_progress, since_s=self.job_progress - self.t0,
            waited_for_timeout_s=self.waited_for_timeout_s,
            cpu={r: round(w.cpu_s, 3) for r, w in self.ranks.items()},
            cpu_busy={r: recent_cores(w.cpu) for r, w in self.ranks.items()},
            ledgers={r: w.ledger for r, w in self.ranks.items() if w.ledger},
            pids={r: w.pid for r, w in self.ranks.items()}, stopped=stop,
            leftover=leftover, notes=tuple(notes), stopped_at=stopped_at)
        return watch, live

    def alive_processes(self) -> list[psutil.Process]:
        return [p for p in self.known.values() if _alive(p)]

    def terminate(self, grace_s: float = GRACE_S) -> tuple[int, ...]:
        """End the whole job: SIGTERM to torchrun's group and every process found in its tree (workers
        have sessions of their own), a short grace, then SIGKILL to anything left. Returns the pids
        still alive (should be none)."""
        self._discover(time.monotonic())
        pgid = self.proc.pid  # start_new_session=True: the group id is torchrun's pid
        try:
            os.killpg(pgid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        gone_by = time.monotonic() + grace_s
        while time.monotonic() < gone_by and self.alive_processes():
            self.proc.poll()
            self._discover(time.monotonic())
            time.sleep(POLL_S)
        for p in self.alive_processes():
            try:
                p.kill()
            except psutil.Error:
                pass
        try:
            os.killpg(pgid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
        psutil.wait_procs(self.alive_processes(), timeout=2)
        return tuple(p.pid for p in self.alive_processes())


class FoundSupervisor(Supervisor):
    """The same loop over processes found, not started (``ddplab attach``): the ranks are given
    (pid, worker-server socket), stacks come from py-spy when no worker server answers, and the job
    has ended on its own when every rank has (its exit status is not ours to read)."""
    finished_as = Ending.EXITED

    def __init__(self, root: psutil.Process, ranks: dict[int, tuple[psutil.Process, str | None]], stall_s: float,
                 t0: float, run_dir: Path):
        super().__init__(_Found(root), run_dir, len(ranks), stall_s, t0)
        self.world = max(ranks) + 1
        self.known[root.pid] = root
        for rank, (proc, sock) in ranks.items():
            self.known[proc.pid] = proc
            self.ranks[rank] = RankWatch(rank, proc.pid, sock, proc, t0)

    def finished(self) -> bool:
        return bool(self.ranks) and not self.live()

    def returncode(self) -> int | None:
        return None

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


class _Found:
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


def watch(sup: Supervisor, *, limit_s: float | None = None, limit: Ending = Ending.DEADLINE,
          echo: Callable[[], None] | None = None, show: Callable[[Snapshot], None] | None = None) -> Ending:
    """The one watch loop, for a started job and an attached one alike (torch's
    ``MultiProcessTestCase._join_processes`` shape: poll, check, sleep). Returns how it ended:
    ``sup.finished_as`` when the job ended on its own (FINISHED: torchrun exited; EXITED: every
    attached rank did), STALL, ``limit`` (DEADLINE or WATCHED) after ``limit_s`` seconds, or
    INTERRUPT (a KeyboardInterrupt: the caller ends the job, keeps the evidence, then raises it
    again). Views only: ``echo()`` after every sample (the ranks' output), ``show`` a Snapshot about
    once a second."""
    shown = 0.0
    try:
        while not sup.finished():
            now = time.monotonic()
            sup.poll()
            if echo is not None:
                echo()
            if show is not None and now - shown >= PROGRESS_EVERY_S:
                shown = now
                show(sup.snapshot(now))
            if limit_s is not None and now - sup.t0 >= limit_s:
                return limit
            if sup.past_limit(now):
                return limit
            if sup.stalled(now):
                return Ending.STALL
            time.sleep(POLL_S)
    except KeyboardInterrupt:
        return Ending.INTERRUPT
    return sup.finished_as
