"""Start a torchrun job, watch it, end it at its deadline with every rank's stack, leave nothing behind.

The job is ``python -m torch.distributed.run`` (torchrun) in its own session, so a lab behaves
exactly like the learner's own job would. ddplab adds three things torchrun does not do:
  * a deadline that it enforces itself, polling, rather than trusting a subprocess timeout;
  * before it ends a job that is still running, each live rank's Python stack (py-spy, or the
    faulthandler hook put on the ranks' PYTHONPATH), read into "rank 0 waits in barrier() at ...";
  * a check with psutil that no process of the job outlives the run, whatever happened
    (deadline, crash, Ctrl-C / Jupyter interrupt).
"""
from __future__ import annotations

import datetime as _dt
import json
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Mapping, Sequence

import psutil

from . import catalog, ports, signatures, stacks
from .envutil import child_environment
from .errors import DdplabError
from .result import RankResult, RunResult

HOOK_DIR = Path(__file__).resolve().parent / "_rankhook"
DEFAULT_SCRIPT_DEADLINE_S = 120.0
POLL_S = 0.05
GRACE_S = 1.5
SETTLE_S = 5.0
# A deadline is for a job that is stuck, not one that is slow: ranks blocked in a collective use no
# CPU, while ranks still importing torch or computing on an overloaded machine do. If the job's
# processes used more than BUSY_CORES of CPU over the last BUSY_WINDOW_S when the deadline comes,
# it gets more time, second by second, up to BUSY_EXTENSION x the deadline more, and a note says so.
BUSY_CORES = 0.3
BUSY_WINDOW_S = 1.0
BUSY_EXTENSION = 1.0


def runs_root() -> Path:
    """$DDPLAB_RUNS_DIR, else ``runs/`` in this checkout (where the labs are), else ./runs."""
    if os.environ.get("DDPLAB_RUNS_DIR"):
        return Path(os.environ["DDPLAB_RUNS_DIR"])
    if catalog.labs_dir().is_dir():
        return catalog.REPO_DIR / "runs"
    return Path.cwd() / "runs"


def max_nproc() -> int:
    """The most ranks that make sense here: 4 per CPU core (already 4x oversubscribed), at least 4."""
    return max(4, 4 * (os.cpu_count() or 1))


def _loopback_ifname() -> str | None:
    for name, addrs in psutil.net_if_addrs().items():
        if any(getattr(a, "address", None) == "127.0.0.1" for a in addrs):
            return name
    return None


@dataclass(frozen=True)
class Job:
    """A resolved, validated request: everything ``build_launch_command`` needs."""
    target: str                 # "01_hang" or the script path as given
    script: Path
    lab: catalog.Lab | None
    variant: str | None
    nproc: int
    deadline_s: float
    port: int                   # 0: let the rendezvous pick a free one
    host: str
    args: tuple[str, ...]
    run_dir: Path
    env: Mapping[str, str] = field(default_factory=dict)


def resolve(target: str | int | os.PathLike, variant: str | None, nproc: int | None, deadline_s: float | None,
            args: Sequence[str] = (), port: int | None = 0, host: str = "127.0.0.1",
            env: Mapping[str, str] | None = None, run_root: Path | None = None) -> Job:
    """Check every input a user can get wrong; raise DdplabError naming the fix."""
    lab = catalog.find_lab(target) if not isinstance(target, os.PathLike) else None
    if lab is not None:
        script = lab.path
        variant = variant or lab.default_variant
        lab.variant(variant)  # raises with the list of variants
        name = lab.id
        script_args = ("--variant", variant, *args)
        nproc = lab.nproc if nproc is None else nproc
        deadline_s = lab.deadline_s if deadline_s is None else deadline_s
    else:
        script = Path(target)
        if not script.exists():
            known = ", ".join(l.number for l in catalog.labs())
            if str(target).endswith(".py") or os.sep in str(target):
                raise DdplabError(f"no such script: {target}", hint="check the path (it is relative to the current folder)")
            raise DdplabError(f"unknown lab '{target}'",
                              hint=f"run `ddplab list` to see the labs ({known}), or pass the path of a script")
        if script.is_dir() or script.suffix != ".py":
            raise DdplabError(f"{target} is not a Python script", hint="pass a .py file that torchrun can run")
        if variant is not None:
            raise DdplabError("--variant is for labs", hint=f"pass the script's own flags after `--` instead (ddplab run {target} -- ...)")
        name = script.stem
        script_args = tuple(args)
        nproc = 2 if nproc is None else nproc
        deadline_s = DEFAULT_SCRIPT_DEADLINE_S if deadline_s is None else deadline_s
    if not isinstance(nproc, int) or isinstance(nproc, bool):
        raise DdplabError(f"--nproc must be a whole number, not {nproc!r}", hint="for example --nproc 2")
    low = lab.min_nproc if lab else 1
    if nproc < low:
        raise DdplabError(f"--nproc {nproc} is too few for {name}", hint=f"use --nproc {max(low, 2)} (it needs at least {low} ranks)")
    if nproc > max_nproc():
        raise DdplabError(f"--nproc {nproc} is more ranks than this machine can run sensibly ({os.cpu_count()} CPU cores)",
                          hint=f"use --nproc {min(2, max_nproc())} (at most {max_nproc()} here)")
    try:
        deadline_s = float(deadline_s)
    except (TypeError, ValueError):
        raise DdplabError(f"--deadline must be a number of seconds, not {deadline_s!r}", hint="for example --deadline 30") from None
    if not deadline_s > 0:
        raise DdplabError(f"--deadline must be more than 0 seconds (got {deadline_s:g})", hint="for example --deadline 30")
    port = 0 if port is None else int(port)
    if not 0 <= port <= 65535:
        raise DdplabError(f"--port {port} is not a TCP port", hint="use 0 to pick a free one, or 1024-65535")
    if port:
        st = ports.check_port(port, host)
        if not st.free:
            raise DdplabError(st.describe(), hint="pass --port 0 to pick a free one")
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S-%f")[:-3]
    run_dir = Path(run_root or runs_root()) / name / f"{stamp}-{variant or 'run'}"
    return Job(name, script, lab, variant, nproc, deadline_s, port, host, script_args, run_dir, dict(env or {}))


def build_launch_command(job: Job) -> list[str]:
    """The torchrun command line, built in one place (accelerate's ``get_launch_command``)."""
    return [
        sys.executable, "-m", "torch.distributed.run",
        "--nnodes", "1",
        "--nproc-per-node", str(job.nproc),
        # c10d rendezvous on loopback; port 0 lets the store bind a free port itself (no race).
        "--rdzv-backend", "c10d",
        "--rdzv-endpoint", f"{job.host}:{job.port}",
        "--rdzv-id", job.run_dir.name,
        "--local-addr", job.host,
        "--max-restarts", "0",
        # Each rank's stdout and stderr in its own file under the run directory.
        "--log-dir", str(job.run_dir / "torchrun"),
        "--redirects", "3",
        str(job.script), *job.args,
    ]


def launch_environment(job: Job) -> dict[str, str]:
    cores = os.cpu_count() or 1
    changes: dict[str, object] = {
        "DDPLAB_RUN_DIR": str(job.run_dir),
        # The rank hook (faulthandler on SIGUSR1, pid file) goes first on the ranks' path.
        "PYTHONPATH": os.pathsep.join([str(HOOK_DIR), *filter(None, [os.environ.get("PYTHONPATH")])]),
        "PYTHONUNBUFFERED": "1",
        "PYTHONFAULTHANDLER": None,  # the hook enables faulthandler into the rank's stack file
    }
    if "OMP_NUM_THREADS" not in os.environ:
        # torchrun would set 1 with a warning banner; give each rank its share of the cores instead.
        changes["OMP_NUM_THREADS"] = max(1, cores // job.nproc)
    if job.host.startswith("127.") and "GLOO_SOCKET_IFNAME" not in os.environ:
        ifname = _loopback_ifname()
        if ifname:
            changes["GLOO_SOCKET_IFNAME"] = ifname  # gloo would otherwise pick the hostname's interface
    changes.update(job.env)
    return child_environment(changes)


# ----------------------------------------------------------------------------------------------
# Watching and ending the job
# ----------------------------------------------------------------------------------------------

class _Watch:
    """Everything known about the running job: its processes and what its ranks printed."""

    def __init__(self, job: Job, proc: subprocess.Popen, stream: bool):
        self.job, self.proc, self.stream = job, proc, stream
        self.known: dict[int, psutil.Process] = {}
        try:
            self.known[proc.pid] = psutil.Process(proc.pid)
        except psutil.Error:
            pass
        self.offsets: dict[Path, int] = {}
        self.last_scan = 0.0
        self.cpu_of: dict[int, float] = {}          # pid -> last CPU seconds read (kept after exit)
        self.cpu_samples: list[tuple[float, float]] = []

    def sample_cpu(self, now: float) -> None:
        for pid, p in list(self.known.items()):
            try:
                t = p.cpu_times()
                self.cpu_of[pid] = t.user + t.system + t.children_user + t.children_system
            except psutil.Error:
                pass
        self.cpu_samples.append((now, sum(self.cpu_of.values())))
        self.cpu_samples = [s for s in self.cpu_samples if now - s[0] <= 4 * BUSY_WINDOW_S]

    def busy_cores(self) -> float:
        """CPU cores the job's processes used over about the last BUSY_WINDOW_S."""
        if len(self.cpu_samples) < 2:
            return 0.0
        now, total = self.cpu_samples[-1]
        then, before = next(((t, c) for t, c in reversed(self.cpu_samples) if now - t >= BUSY_WINDOW_S),
                            self.cpu_samples[0])
        return (total - before) / (now - then) if now > then else 0.0

    def scan(self, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self.last_scan < 0.25:
            return
        self.last_scan = now
        root = self.known.get(self.proc.pid)
        if root is None:
            return
        try:
            for p in root.children(recursive=True):
                self.known.setdefault(p.pid, p)
        except psutil.Error:
            pass
        self.sample_cpu(now)
        if self.stream:
            self.echo()

    def echo(self) -> None:
        for rank, path in rank_logs(self.job.run_dir):
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
            for line in chunk[:end].decode(errors="replace").splitlines():
                print(line if line.startswith("[rank") else f"[rank {rank}] {line}", flush=True)

    def alive(self) -> list[psutil.Process]:
        out = []
        for p in self.known.values():
            try:
                if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                    out.append(p)
            except psutil.Error:
                pass
        return out


def rank_logs(run_dir: Path) -> list[tuple[int, Path]]:
    """(rank, file) for every rank's stdout.log and stderr.log, last attempt only."""
    found: dict[tuple[int, str], Path] = {}
    for p in sorted((run_dir / "torchrun").glob("*/attempt_*/*/std*.log")):
        try:
            found[(int(p.parent.name), p.name)] = p
        except ValueError:
            continue
    return sorted((rank, p) for (rank, _), p in found.items())


def rank_pids(run_dir: Path) -> dict[int, int]:
    out = {}
    for p in (run_dir / "ranks").glob("rank*.json"):
        try:
            d = json.loads(p.read_text())
            out[int(d["rank"])] = int(d["pid"])
        except (ValueError, KeyError, OSError):
            continue
    return out


def _pid_alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def capture_stacks(run_dir: Path, pids: Mapping[int, int]) -> tuple[dict[int, tuple[list[stacks.Frame], str]], list[str]]:
    """Each live rank's main-thread stack: py-spy first, faulthandler (SIGUSR1) if py-spy cannot."""
    got: dict[int, tuple[list[stacks.Frame], str]] = {}
    notes: list[str] = []
    force_fh = os.environ.get("DDPLAB_STACKS") == "faulthandler"
    for rank, pid in sorted(pids.items()):
        if not _pid_alive(pid):
            continue
        frames, why = (None, "DDPLAB_STACKS=faulthandler") if force_fh else stacks.pyspy_dump(pid)
        if frames is not None:
            got[rank] = (frames, "py-spy")
            continue
        frames = _faulthandler_dump(run_dir, rank, pid)
        if frames:
            got[rank] = (frames, "faulthandler")
            notes.append(f"rank {rank}: stack from faulthandler ({why})")
        else:
            notes.append(f"rank {rank}: no stack ({why}; faulthandler gave nothing)")
    return got, notes


def _faulthandler_dump(run_dir: Path, rank: int, pid: int, wait_s: float = 1.0) -> list[stacks.Frame]:
    path = run_dir / "ranks" / f"rank{rank}.stack.txt"
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


def terminate(watch: _Watch, grace_s: float = GRACE_S) -> tuple[int, ...]:
    """End the whole job: SIGTERM to its process group, a short grace, then SIGKILL to anything
    left (including processes that left the group). Returns the pids still alive (should be none)."""
    watch.scan(force=True)
    pgid = watch.proc.pid  # start_new_session=True: the group id is torchrun's pid
    try:
        os.killpg(pgid, signal.SIGTERM)
    except ProcessLookupError:
        pass
    gone_by = time.monotonic() + grace_s
    while time.monotonic() < gone_by and watch.alive():
        watch.proc.poll()
        time.sleep(POLL_S)
    for p in watch.alive():
        try:
            p.kill()
        except psutil.Error:
            pass
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        watch.proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        pass
    psutil.wait_procs(watch.alive(), timeout=2)
    return tuple(p.pid for p in watch.alive())


# ----------------------------------------------------------------------------------------------
# Reading what happened
# ----------------------------------------------------------------------------------------------

_SUMMARY = re.compile(r"rank\s*:\s*(\d+) \(local_rank: \d+\)\s*\n\s*exitcode\s*:\s*(-?\d+) \(pid: (\d+)\)")
_ROOT = re.compile(r"Root Cause \(first observed failure\):\s*\n\[\d+\]:\s*\n(?:.*\n){0,3}?\s*rank\s*:\s*(\d+)")


def _signal_name(code: int) -> str:
    try:
        return signal.Signals(-code).name
    except ValueError:
        return f"signal {-code}"


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


def _records(run_dir: Path, rank: int) -> tuple[dict, ...]:
    out = []
    for line in _read(run_dir / "ranks" / f"rank{rank}.records.jsonl").splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            continue
    return tuple(out)


def collect(job: Job, cmd: list[str], returncode: int | None, ended_by: str | None, wall_s: float,
            stacks_by_rank: Mapping[int, tuple[list[stacks.Frame], str]], alive_at_end: Iterable[int],
            leftover: tuple[int, ...], notes: list[str]) -> RunResult:
    run_dir = job.run_dir
    console = _read(run_dir / "torchrun.log")
    exits = {int(r): (int(code), int(pid)) for r, code, pid in _SUMMARY.findall(console)}
    root = _ROOT.search(console)
    root_rank = int(root.group(1)) if root else None
    pids = rank_pids(run_dir)
    logs: dict[int, str] = {}
    for rank, path in rank_logs(run_dir):
        logs[rank] = logs.get(rank, "") + _read(path)
    alive_ranks = set(alive_at_end)

    ranks = []
    states = []
    for rank in range(job.nproc):
        frames, source = stacks_by_rank.get(rank, ([], None))
        w = stacks.where(frames) if frames else None
        if rank in alive_ranks:
            state, code, sig = "hung", None, "SIGTERM"
        elif rank in exits:
            c, _ = exits[rank]
            state, code, sig = "exited", (c if c >= 0 else None), (_signal_name(c) if c < 0 else None)
        elif rank not in pids and returncode != 0:
            state, code, sig = "not-started", None, None
        elif returncode == 0 or ended_by is not None:
            # torchrun ends every rank as soon as one fails, so a rank that left before the
            # deadline while others still ran had exited cleanly.
            state, code, sig = "exited", 0, None
        else:
            state, code, sig = "exited", None, None
        fault = _read(run_dir / "ranks" / f"rank{rank}.stack.txt")
        if not frames and fault and "Fatal Python error" in fault:
            frames, source = stacks.parse_faulthandler(fault), "faulthandler (fatal signal)"
            w = stacks.where(frames)
        log = logs.get(rank, "")
        if not frames and state == "exited" and code != 0 and (code is not None or sig is not None):
            frames, source = stacks.parse_traceback(log), "traceback"
            w = stacks.where(frames) if frames else None
        ranks.append(RankResult(
            rank=rank, pid=pids.get(rank), state=state, exit_code=code, signal=sig,
            user_frame=w.user_frame.short() if w and w.user_frame else None,
            waits_in=w.waits_in if w and state == "hung" else None,
            stack=tuple(f.short() for f in frames), stack_source=source,
            records=_records(run_dir, rank), log_tail="\n".join(log.splitlines()[-15:])))
        states.append((rank, state, w.waits_in if w and state == "hung" else None, w.kind if w else "other"))

    if ended_by == "interrupt":
        status = "interrupted"
    elif ended_by == "deadline":
        status = "hung"
    else:
        status = "ok" if returncode == 0 else "failed"

    signature = excerpt = first_failure = None
    diagnosis = ""
    if status in ("hung", "interrupted") and not pids:
        signature = "deadline-exceeded"
        diagnosis = (f"No rank had started by the {job.deadline_s:g} s deadline: torchrun was still starting "
                     "(a slow or busy machine). Raise the deadline.")
        excerpt = "no rank started"
    elif status in ("hung", "interrupted") and alive_ranks:
        sig, desc = signatures.match_stacks(states)
        signature, excerpt = sig.id, desc
        parts = []
        for r in ranks:
            if r.state == "hung":
                w = stacks.Where(None, r.waits_in, "")
                parts.append(stacks.describe(r.rank, w) + (f" at {r.user_frame}" if r.user_frame else ""))
            else:
                parts.append(f"rank {r.rank} had already exited ({'exit ' + str(r.exit_code) if r.exit_code is not None else r.signal})")
        verb = "was interrupted" if status == "interrupted" else f"was still running at its {job.deadline_s:g} s deadline"
        diagnosis = f"The job {verb}: " + "; ".join(parts) + "."
    elif status == "failed":
        first_failure = root_rank
        order = ([root_rank] if root_rank is not None else []) + [r for r in sorted(logs) if r != root_rank]
        text = "\n".join(logs.get(r, "") for r in order) + "\n" + console
        text += "\n".join(_read(run_dir / "ranks" / f"rank{r}.stack.txt") for r in range(job.nproc))
        # The first failure's own words first; another rank's only if it says something more specific.
        m = signatures.match_text(logs.get(root_rank, "")) if root_rank is not None else None
        lost_peer = m is not None and m[0].id == "peer-lost"
        if lost_peer:
            # torchrun's "Root Cause" is the first exit it observed, not the first error: a rank
            # that lost its peer (gloo aborts with SIGABRT) can die before the rank whose own
            # error closed the connection has finished exiting. That rank failed first.
            for r in sorted(logs):
                mr = signatures.match_text(logs[r]) if r != root_rank else None
                if mr is not None and mr[0].id not in signatures.GENERIC:
                    first_failure, m = r, mr
                    break
        if m is None or m[0].id in signatures.GENERIC:
            m_all = signatures.match_text(text)
            if m_all is not None and (m is None or m_all[0].id not in signatures.GENERIC):
                m = m_all
        if m:
            signature, excerpt = m[0].id, m[1]
        if not logs:
            last = [l for l in console.splitlines() if l.strip()][-1:] or ["(no output)"]
            diagnosis = f"torchrun failed before any rank started: {last[0].strip()}"
        first = f"rank {first_failure}" if first_failure is not None else "a rank"
        rr = next((r for r in ranks if r.rank == first_failure), None)
        how = ""
        if rr is not None:
            if first_failure == root_rank:
                how = f" with exit code {rr.exit_code}" if rr.exit_code is not None else f" by {rr.signal}"
            if rr.user_frame:
                how += f" at {rr.user_frame}"
        if logs:
            diagnosis = f"{first} failed first{how}" + (f": {excerpt}" if excerpt else "") + "."
            if first_failure != root_rank and root_rank is not None:
                rt = next(r for r in ranks if r.rank == root_rank)
                died = f"exit code {rt.exit_code}" if rt.exit_code is not None else rt.signal
                diagnosis += (f" Rank {root_rank} then lost its connection to it and died ({died}); torchrun's "
                              f"summary calls rank {root_rank} the root cause because it saw that exit first.")
            diagnosis += " torchrun then ended the other ranks."
    result = RunResult(
        target=job.target, variant=job.variant, nproc=job.nproc, status=status, signature=signature,
        excerpt=excerpt, diagnosis=diagnosis, ranks=tuple(ranks), wall_s=round(wall_s, 3),
        deadline_s=job.deadline_s, run_dir=str(run_dir), command=tuple(cmd),
        port=_port_used(run_dir, job.port), returncode=returncode, leftover=leftover, notes=tuple(notes),
        first_failure=first_failure)
    result.save()
    return result


def _port_used(run_dir: Path, asked: int) -> int | None:
    for p in (run_dir / "ranks").glob("rank*.json"):
        try:
            return int(json.loads(p.read_text()).get("master_port"))
        except (ValueError, TypeError, OSError):
            continue
    return asked or None


# ----------------------------------------------------------------------------------------------
# The entry point
# ----------------------------------------------------------------------------------------------

def run(target: str | int | os.PathLike, variant: str | None = None, nproc: int | None = None,
        deadline_s: float | None = None, args: Sequence[str] = (), env: Mapping[str, str] | None = None,
        port: int | None = 0, stream: bool = False, run_root: str | Path | None = None,
        grace_s: float = GRACE_S) -> RunResult:
    """Run a lab (number or name) or any torchrun-able script on ``nproc`` local ranks.

    Returns a RunResult whose ``status`` is "ok", "failed" (a rank exited with an error) or
    "hung" (still running at ``deadline_s`` seconds: stacks read, job ended). A KeyboardInterrupt
    ends the job the same way, saves the result as "interrupted", then propagates.
    """
    job = resolve(target, variant, nproc, deadline_s, tuple(args), port, env=env,
                  run_root=Path(run_root) if run_root else None)
    job.run_dir.mkdir(parents=True, exist_ok=True)
    (job.run_dir / "ranks").mkdir(exist_ok=True)
    cmd = build_launch_command(job)
    (job.run_dir / "command.json").write_text(json.dumps({"command": cmd, "env": dict(job.env)}, indent=2))
    t0 = time.monotonic()
    with open(job.run_dir / "torchrun.log", "wb") as console:
        # Own session: Ctrl-C in a terminal does not reach torchrun directly; ddplab ends it below.
        proc = subprocess.Popen(cmd, stdout=console, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env=launch_environment(job), start_new_session=True)
    watch = _Watch(job, proc, stream)
    ended_by = None
    got: dict = {}
    notes: list[str] = []
    alive_ranks: list[int] = []
    extended = False
    try:
        deadline = t0 + job.deadline_s
        last_chance = t0 + job.deadline_s * (1 + BUSY_EXTENSION)
        settled = extended = False
        while proc.poll() is None:
            now = time.monotonic()
            if now >= deadline:
                pids = rank_pids(job.run_dir)
                if pids and not settled and not any(_pid_alive(p) for p in pids.values()):
                    # Every rank has exited and torchrun is only shutting down: let it finish.
                    settled, deadline = True, now + SETTLE_S
                    continue
                watch.scan(force=True)
                if not settled and now < last_chance and watch.busy_cores() > BUSY_CORES:
                    deadline, extended = now + 0.5, True   # still working, not waiting: look again soon
                    continue
                if extended:
                    notes.append(f"the deadline was extended by {now - t0 - job.deadline_s:.1f} s because the "
                                 "job was still using CPU (busy, not waiting)")
                ended_by = "deadline"
                break
            watch.scan()
            time.sleep(POLL_S)
    except KeyboardInterrupt:
        ended_by = "interrupt"
        raise
    finally:
        if ended_by is not None:
            watch.scan(force=True)
            pids = rank_pids(job.run_dir)
            alive_ranks = [r for r, pid in pids.items() if _pid_alive(pid)]
            got, stack_notes = capture_stacks(job.run_dir, {r: pids[r] for r in alive_ranks})
            notes += stack_notes
        elif extended:
            notes.append(f"finished {time.monotonic() - t0 - job.deadline_s:.1f} s after its {job.deadline_s:g} s "
                         "deadline, which was extended because the job was still using CPU (busy, not waiting)")
        leftover = terminate(watch, grace_s) if (ended_by or watch.alive()) else ()
        if stream:
            watch.echo()
        if leftover:
            notes.append(f"processes still alive after cleanup: {list(leftover)}")
        result = collect(job, cmd, proc.returncode if ended_by is None else None, ended_by,
                         time.monotonic() - t0, got, alive_ranks, leftover, notes)
        if ended_by == "interrupt":
            print(f"ddplab: interrupted; the job was ended and its stacks saved in {result.run_dir}", file=sys.stderr)
    return result
