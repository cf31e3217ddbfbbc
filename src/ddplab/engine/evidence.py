"""Reading evidence: what the ranks did, as data, from the live job and from what it left behind.

Live, at the moment of a verdict (``capture_live``), for each rank still running: its main-thread
stack (torch's worker server over the rank's socket; py-spy from outside; the faulthandler hook on
SIGUSR1 last), the kernel's wait channel, its flight-recorder ledger, its TCP sockets and, if it is
stuck in the rendezvous, the address it is dialling.

Afterwards (``read_run``): each rank's start record and exception record (written by the rank
hook), faulthandler dumps of fatal signals, torchrun's outcome (``torchrun.json``, written by
``ddplab.origins._torchrun`` from torchrun's ChildFailedError), the ranks' logs. Nothing here parses
ddplab's own display text; the only text matched is PyTorch's and the kernel's own messages in the
ranks' logs (``ddplab.engine.signatures``), and a traceback only where a rank died without a record.

``collect`` puts it together with what the watch loop saw (``Watch``) into one ``Evidence``: all a
verdict needs (``ddplab.engine.classify.judge``), for a job ddplab started, one it attached to, or the
folders ``attach --save`` wrote on several nodes (``ddplab.origins.nodes``). The files' names are
``ddplab.runfiles``'.
"""
from __future__ import annotations

import json
import os
import signal
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Mapping

import psutil

from ddplab.engine import ledger as ledger_mod
from ddplab.engine import probe, stacks
from ddplab import runfiles
from ddplab.defaults import Ending
from ddplab.facts import CallSite, ChildProcess, Ended, Poll, ThreadStack
from ddplab.result import RankError


def calls_of(records) -> tuple[CallSite, ...]:
    """The rank hook's call records as CallSites (a malformed one is left out)."""
    out = []
    for d in records or ():
        try:
            out.append(CallSite.from_dict(d))
        except (TypeError, ValueError, KeyError, IndexError):
            continue
    return tuple(out)


def _rank_files(run_dir: Path, kind: str) -> list[tuple[int, Path]]:
    """(rank, path) of every rank file of one kind in a run folder."""
    out = []
    for p in (Path(run_dir) / runfiles.RANKS).glob("rank*"):
        rank = runfiles.rank_of(p.name, kind)
        if rank is not None:
            out.append((rank, p))
    return sorted(out)


def rank_infos(run_dir: Path) -> dict[int, dict]:
    """What each rank's hook wrote at start (pid, socket, the address torchrun gave it)."""
    out = {}
    for _, p in _rank_files(run_dir, runfiles.INFO):
        try:
            d = json.loads(p.read_text())
            out[int(d["rank"])] = d
        except (ValueError, KeyError, OSError):
            continue
    return out


@dataclass
class LiveRank:
    """One running rank as captured at the verdict."""
    rank: int
    pid: int
    frames: list = field(default_factory=list)
    source: str | None = None
    wchan: str | None = None
    ledger: tuple = ()
    connections: tuple = ()
    dialling: dict | None = None
    note: str | None = None
    calls: tuple = ()             # the hook's call records (facts.CallSite), live
    threads: tuple = ()           # every thread's stack (facts.ThreadStack), live
    children: tuple = ()          # the child processes it started (facts.ChildProcess), live
    polls: tuple = ()             # files its own code looked for and did not find (facts.Poll), live


def capture_live(run_dir: Path, ranks: Mapping[int, dict], ledgers: Mapping[int, tuple]) -> dict[int, LiveRank]:
    """Everything readable from each live rank, now (before the job is ended)."""
    out = {}
    force_fh = os.environ.get("DDPLAB_STACKS") == "faulthandler"
    for rank, info in sorted(ranks.items()):
        pid = int(info["pid"])
        try:
            proc = psutil.Process(pid)
            if proc.status() == psutil.STATUS_ZOMBIE:
                continue
        except psutil.Error:
            continue
        live = LiveRank(rank, pid, wchan=stacks.read_wchan(pid), ledger=tuple(ledgers.get(rank, ())))
        sock = info.get("socket")
        if sock and not force_fh:
            text = probe.traceback(sock)
            if text:
                live.frames, live.source = stacks.parse_faulthandler_main(text), "worker-server"
        if not live.frames and not force_fh:
            frames, why = stacks.pyspy_dump(pid)
            if frames is not None:
                live.frames, live.source = frames, "py-spy"
            else:
                live.note = why
        if not live.frames:
            frames = faulthandler_dump(run_dir, rank, pid)
            if frames:
                live.frames, live.source = frames, "faulthandler"
        if sock:
            dump = probe.ledger(sock)
            if dump is not None:
                live.ledger = ledger_mod.parse(dump)
            live.dialling = probe.rendezvous_target(sock)
            channels = probe.rank_channels(sock)
            if channels:
                live.calls = calls_of(channels.get("calls"))
                live.threads = tuple(ThreadStack.from_dict(t) for t in channels.get("threads") or ())
                live.children = tuple(_child(c) for c in channels.get("children") or ())
                live.polls = tuple(Poll.from_dict(p) for p in channels.get("polls") or ())
        if not live.children:
            # a rank at exit no longer answers live: the non-daemon children its hook wrote when it started them
            try:
                d = json.loads(Path(runfiles.rank_path(run_dir, rank, runfiles.CHILDREN)).read_text())
                live.children = tuple(_child(c) for c in d.get("children") or ())
            except (OSError, ValueError, AttributeError):
                pass
        live.connections = tcp_connections(proc)
        out[rank] = live
    return out


def _child(d: dict) -> ChildProcess:
    """A child process the hook recorded, with whether its pid still runs now."""
    c = ChildProcess.from_dict(d)
    try:
        alive = c.pid is not None and psutil.pid_exists(int(c.pid)) and \
            psutil.Process(int(c.pid)).status() != psutil.STATUS_ZOMBIE
    except (psutil.Error, ValueError):
        alive = False
    return ChildProcess(c.name, c.pid, c.daemon, c.started, alive)


_TCP_STATES = {"01": "ESTABLISHED", "02": "SYN_SENT", "03": "SYN_RECV", "04": "FIN_WAIT1", "05": "FIN_WAIT2",
               "06": "TIME_WAIT", "07": "CLOSE", "08": "CLOSE_WAIT", "09": "LAST_ACK", "0A": "LISTEN", "0B": "CLOSING"}


def _other_netns(pid: int) -> bool:
    try:
        return os.readlink(f"/proc/{pid}/ns/net") != os.readlink("/proc/self/ns/net")
    except OSError:
        return False


def _hex_addr(text: str) -> str:
    import ipaddress
    host, port = text.split(":")
    raw = bytes.fromhex(host)
    if len(raw) == 4:
        ip = str(ipaddress.IPv4Address(raw[::-1]))
    else:
        v6 = ipaddress.IPv6Address(b"".join(raw[i:i + 4][::-1] for i in range(0, 16, 4)))
        ip = str(v6.ipv4_mapped or v6)
    return f"{ip}:{int(port, 16)}"


def socket_inodes(pid: int) -> set[str] | None:
    """The inodes of a process's sockets (its /proc/PID/fd links); None where they cannot be read."""
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return None
    inodes = set()
    for fd in fds:
        try:
            link = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if link.startswith("socket:["):
            inodes.add(link[8:-1])
    return inodes


def netns_tcp_rows(pid: int, inodes: set[str]) -> list[list[str]]:
    """The rows of /proc/PID/net/tcp and tcp6 (the process's own network namespace) whose socket is
    one of ``inodes``, split into their fields: sl local remote st tx_queue:rx_queue tr:tm->when
    retrnsmt uid timeout inode ..."""
    rows = []
    for table in ("tcp", "tcp6"):
        try:
            lines = Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]
        except OSError:
            continue
        for ln in lines:
            f = ln.split()
            if len(f) > 9 and f[9] in inodes:
                rows.append(f)
    return rows


_RETRANSMIT_TIMER = "01"    # /proc/net/tcp's "tr" field: 01 retransmission, 02 keepalive, 04 zero-window probe


def tcp_queues(pid: int, pids: list[int]) -> dict[str, tuple[int, int, int]]:
    """Each established TCP connection of ``pids`` (a rank and its children), by socket inode, as
    ``pid``'s network namespace sees it: bytes not yet acknowledged by the peer, bytes received and not
    yet read, and how many times in a row the kernel has resent unacknowledged bytes (0 unless the
    retransmission timer is armed on some). Linux (/proc); empty elsewhere. A connection still dialling
    (SYN_SENT) is not one: a firewall that drops it and a lossy link look the same there."""
    inodes = set().union(*(socket_inodes(q) or () for q in pids))
    out: dict[str, tuple[int, int, int]] = {}
    for f in netns_tcp_rows(pid, inodes) if inodes else ():
        if _TCP_STATES.get(f[3]) != "ESTABLISHED":
            continue
        tx, rx = (int(v, 16) for v in f[4].split(":"))
        resent = int(f[6], 16) if tx and f[5].split(":")[0] == _RETRANSMIT_TIMER else 0
        out[f[9]] = (tx, rx, resent)
    return out


def netns_tcp_connections(pid: int) -> tuple[dict, ...]:
    """A process's TCP sockets as its own network namespace sees them (/proc/PID/net/tcp, matched to
    its file descriptors): psutil reads /proc/net, the caller's namespace, and finds nothing for a
    rank on a ddplab.origins.cluster node."""
    inodes = socket_inodes(pid)
    if inodes is None:
        return ()
    out = []
    for f in netns_tcp_rows(pid, inodes):
        remote = _hex_addr(f[2])
        out.append({"laddr": _hex_addr(f[1]), "raddr": None if remote.endswith(":0") else remote,
                    "status": _TCP_STATES.get(f[3], f[3])})
    return tuple(out)


def tcp_connections(proc: psutil.Process) -> tuple[dict, ...]:
    if _other_netns(proc.pid):
        return netns_tcp_connections(proc.pid)
    try:
        conns = proc.net_connections(kind="tcp")
    except (psutil.Error, AttributeError):
        try:
            conns = proc.connections(kind="tcp")   # psutil < 6
        except psutil.Error:
            return ()
    out = []
    for c in conns:
        out.append({"laddr": f"{c.laddr.ip}:{c.laddr.port}" if c.laddr else None,
                    "raddr": f"{c.raddr.ip}:{c.raddr.port}" if c.raddr else None, "status": c.status})
    return tuple(out)


def faulthandler_dump(run_dir: Path, rank: int, pid: int, wait_s: float = 1.0) -> list:
    """SIGUSR1 to the rank's faulthandler (registered by the rank hook); its dump of the main thread."""
    path = Path(runfiles.rank_path(run_dir, rank, runfiles.STACK))
    start = path.stat().st_size if path.exists() else 0
    try:
        os.kill(pid, signal.SIGUSR1)
    except (OSError, AttributeError):
        return []
    end = time.monotonic() + wait_s
    size = start
    while time.monotonic() < end:
        time.sleep(0.02)
        new = path.stat().st_size if path.exists() else 0
        if new > start and new == size:  # written and no longer growing
            break
        size = new
    try:
        with open(path, "r", errors="replace") as f:
            f.seek(start)
            return stacks.parse_faulthandler(f.read())
    except OSError:
        return []


# ------------------------------------------------------------------------------------------------
# After the job
# ------------------------------------------------------------------------------------------------

@dataclass
class RunEvidence:
    """What the job left behind, as data."""
    infos: dict[int, dict]                 # rank -> its start record
    errors: dict[int, RankError]           # rank -> its uncaught exception
    exits: dict[int, dict]                 # rank -> {"exitcode", "signal", "pid", "timestamp"} (failed ranks)
    torchrun: dict | None                  # torchrun.json (None: torchrun did not finish on its own)
    logs: dict[int, str]                   # rank -> stdout + stderr
    fatal: dict[int, list]                 # rank -> frames of a faulthandler fatal-signal dump
    console: str                           # torchrun's own output
    clean_exit: dict[int, float] = field(default_factory=dict)   # rank -> time of a normal interpreter exit
    final_ledgers: dict[int, tuple] = field(default_factory=dict)  # rank -> its ledger as it exited
    terminated: dict[int, list] = field(default_factory=dict)   # rank -> main-thread frames when SIGTERM came
    calls: dict[int, tuple] = field(default_factory=dict)       # rank -> its call records (exit or error record)
    threads: dict[int, tuple] = field(default_factory=dict)     # rank -> threads still running at its shutdown
    ended: dict[int, Ended] = field(default_factory=dict)       # rank -> how it ended without a traceback
    streams: dict[int, dict] = field(default_factory=dict)      # rank -> {"stdout": text, "stderr": text} (logs, apart)


def read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


def folders_now(e: RankError) -> RankError:
    """The error with whether the folder of each file it is about exists now (at the verdict): a filesystem
    fact the rank could not know when it failed (a peer made the folder after it)."""
    if not e.paths:
        return e
    return replace(e, paths=tuple(replace(p, folder_now=os.path.isdir(p.folder)) for p in e.paths))


def read_run(run_dir: Path) -> RunEvidence:
    infos = rank_infos(run_dir)
    errors, calls, threads, ended = {}, {}, {}, {}
    for _, p in _rank_files(run_dir, runfiles.ERROR):
        try:
            d = json.loads(p.read_text())
            errors[int(d["rank"])] = folders_now(RankError.from_dict(d))
            calls[int(d["rank"])] = calls_of(d.get("calls"))
        except (ValueError, KeyError, OSError):
            continue
    for _, p in _rank_files(run_dir, runfiles.THREADS):
        try:
            d = json.loads(p.read_text())
            threads[int(d["rank"])] = tuple(ThreadStack.from_dict(t) for t in d.get("threads") or ())
        except (ValueError, KeyError, OSError):
            continue
    for _, p in _rank_files(run_dir, runfiles.ENDED):
        try:
            d = json.loads(p.read_text())
            ended[int(d["rank"])] = Ended.from_dict(d)
            calls.setdefault(int(d["rank"]), calls_of(d.get("calls")))
        except (ValueError, KeyError, OSError):
            continue
    tr = None
    try:
        tr = json.loads((run_dir / runfiles.TORCHRUN).read_text())
    except (OSError, ValueError):
        pass
    exits = {int(r): f for r, f in (tr or {}).get("failures", {}).items()}
    logs: dict[int, str] = {}
    streams: dict[int, dict] = {}
    for rank, path in runfiles.rank_logs(run_dir):
        text = read(Path(path))
        logs[rank] = logs.get(rank, "") + text
        streams.setdefault(rank, {})[Path(path).stem] = text
    fatal = {}
    for rank in infos:
        text = read(Path(runfiles.rank_path(run_dir, rank, runfiles.STACK)))
        if "Fatal Python error" in text:
            fatal[rank] = stacks.parse_faulthandler(text[text.rfind("Fatal Python error"):])
    terminated = {}
    for rank in infos:
        frames = stacks.parse_faulthandler_last_main(read(Path(runfiles.rank_path(run_dir, rank, runfiles.TERM))))
        if frames:
            terminated[rank] = frames
    clean_exit, final_ledgers = {}, {}
    for _, p in _rank_files(run_dir, runfiles.EXIT):
        try:
            d = json.loads(p.read_text())
        except (ValueError, OSError):
            continue
        rank = int(d.get("rank", -1))
        if rank not in errors:
            clean_exit[rank] = float(d.get("time", 0))
        if d.get("ledger"):
            final_ledgers[rank] = ledger_mod.parse(d["ledger"])
        if d.get("calls"):
            calls.setdefault(rank, calls_of(d["calls"]))
    for _, p in _rank_files(run_dir, runfiles.CALLS):
        # written at a collective called with an exception in flight: a later record (error, exit) holds them
        # all; a rank aborted in that collective (gloo's SIGABRT) has no other
        try:
            d = json.loads(p.read_text())
            calls.setdefault(int(d["rank"]), calls_of(d.get("calls")))
        except (ValueError, KeyError, OSError):
            continue
    return RunEvidence(infos, errors, exits, tr, logs, fatal, read(run_dir / runfiles.TORCHRUN_LOG), clean_exit,
                       final_ledgers, terminated, calls, threads, ended, streams)



def records(run_dir: Path, rank: int) -> tuple[dict, ...]:
    out = []
    for line in read(Path(runfiles.rank_path(run_dir, rank, runfiles.RECORDS))).splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            continue
    return tuple(out)


# ------------------------------------------------------------------------------------------------
# Everything a verdict needs
# ------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Watch:
    """What the one watch loop saw (``ddplab.engine.supervise.watch``), as data."""
    ended_by: Ending          # how the watch ended (defaults.Ending); DUMPED: nobody watched
    returncode: int | None    # torchrun's exit status when it ended on its own
    world: int                # ranks in the job (a multi-node job: every node's)
    stall_s: float | None     # the stall window (None: nobody watched, as for torch's own dumps)
    wall_s: float             # seconds watched
    idle_s: float             # seconds since the last progress, at the verdict
    since_s: float            # the last progress, seconds after the watch began
    waited_for_timeout_s: float | None = None
    cpu: dict = field(default_factory=dict)       # rank -> CPU seconds (with its children)
    cpu_busy: dict = field(default_factory=dict)  # rank -> cores used over its last second watched
    ledgers: dict = field(default_factory=dict)   # rank -> the last ledger sampled
    pids: dict = field(default_factory=dict)      # rank -> pid
    stopped: bool = True      # the job was ended (always for ``run``; ``attach --stop``)
    ranks_here: tuple[int, ...] | None = None     # attach: the ranks on this machine (None: all)
    leftover: tuple[int, ...] = ()
    notes: tuple[str, ...] = ()
    # time.time() when ddplab began ending the job (None: it ended on its own, or nobody ended it); an
    # error a rank raised after it is the ending's consequence (a peer killed first), not the job's
    stopped_at: float | None = None


def raised_before(run: RunEvidence, t: float | None) -> RunEvidence:
    """The evidence without the uncaught exceptions raised at or after ``t`` (when ddplab began ending
    the job): torchrun ends the ranks one after another, and a rank blocked in a collective raises
    (gloo: "Connection closed by peer") when the peer it waits on dies first. That error is the
    ending's, not the job's: it must not turn a hang into a failure."""
    if t is None or not any(e.time >= t for e in run.errors.values()):
        return run
    return replace(run, errors={r: e for r, e in run.errors.items() if e.time < t})


@dataclass
class Evidence:
    """Everything ``classify.judge`` needs: what the loop saw, what the live ranks showed at the
    verdict, and what the ranks left behind."""
    watch: Watch
    run: RunEvidence
    live: dict[int, LiveRank]
    ledgers: dict[int, tuple]     # rank -> its newest ledger
    records: dict[int, tuple]     # rank -> ddplab.rank.lab.record's events
    nodes: dict[int, str] = field(default_factory=dict)   # rank -> node name (merged folders)


def dumped(live: dict, ledgers: dict, world: int, note: str) -> "Evidence":
    """The evidence of a job known only from dumps taken while it ran (torch's flight recorder, its
    debug server): each rank as it stood when dumped; nobody watched, so no stall facts, no duration."""
    w = Watch(ended_by=Ending.DUMPED, returncode=None, world=world, stall_s=None, wall_s=0.0, idle_s=0.0,
              since_s=0.0, stopped=False, notes=(note,))
    return Evidence(w, empty_run({}), live, dict(ledgers), {})


def empty_run(pids: Mapping[int, int]) -> RunEvidence:
    """No folder to read (a job ddplab did not start): only the ranks' pids."""
    return RunEvidence(infos={r: {"pid": p} for r, p in pids.items()}, errors={}, exits={}, torchrun=None, logs={},
                       fatal={}, console="")


def collect(watch: Watch, live: Mapping[int, LiveRank], run_dir: Path | None) -> Evidence:
    """One Evidence from the loop's facts, the live ranks and the run folder (None: nothing left
    behind to read). Each rank's newest ledger: the last one sampled, an exited rank's own last word
    from its exit record, a live rank's read at the verdict."""
    run = read_run(Path(run_dir)) if run_dir is not None else empty_run(watch.pids)
    for r, pid in watch.pids.items():
        run.infos.setdefault(r, {"pid": pid})
    ledgers = dict(watch.ledgers)
    ledgers.update(run.final_ledgers)
    ledgers.update({r: lv.ledger for r, lv in live.items() if lv.ledger})
    recs = {r: records(Path(run_dir), r) for r in range(watch.world)} if run_dir is not None else {}
    return Evidence(watch, run, dict(live), ledgers, recs)
