"""Forked ranks: a lab's ranks are forks of a process that has already imported torch.

Why: a rank spends 1.2-1.5 CPU-s here importing torch before its script does anything, against
about 0.04 CPU-s for a fork; the test suite starts about 600 ranks and the workbook about 150.

How: a run's warm agent (``ddplab.origins.warm``, itself forked from a process that imported
``PRELOAD``) forks one more child before torchrun starts: the zygote, single-threaded. The agent
marks itself a child subreaper and has torchrun start each worker through the zygote instead of
``subprocess.Popen`` (``SubprocessHandler._popen``, the one place torchrun starts a worker). The
zygote forks a child that forks the rank and exits, so the rank is reparented to the agent: a child
of torchrun's agent, as a Popen'd worker is, which torchrun polls, signals (its own session) and
waits for through ``ForkedRank``, Popen's interface. The rank then becomes what ``python -u
script.py`` with the worker's environment would be (``_become_rank``): its session, environment,
working folder, argv, ``sys.path`` (the script's folder, PYTHONPATH, the rest), unbuffered stdout
and stderr on torchrun's files, fresh random seeds (Python's, numpy's), torch's thread count from
OMP_NUM_THREADS, the rank hook (``sitecustomize``) imported from its PYTHONPATH, the script run as
``__main__`` and the interpreter's own exit (threads joined, atexit, buffers flushed).

What differs, and why only a lab's ranks are forked (``Job.fork_ranks``): every forked rank has its
parent's string-hash seed, so iterating a set of strings gives the same order on every rank, where
fresh interpreters each draw their own; a script whose ranks diverge only through that would not
show it. ddplab's own lab scripts do not depend on it, and the catalog's outcome of every variant is
checked on forked ranks; a user's script (``ddplab run path.py``, a notebook's ``%%ddplab`` cell, a
fix-it attempt) gets fresh processes. Besides: modules are imported before the script runs; ``ps``
shows the warm process's command line and ``/proc/PID/environ`` its start environment (a rank's own
is in ``os.environ``; the hook's ``rankN.json`` records ``forked_from``). A worker whose environment
differs from the agent's in what torch or Python read at import, a zygote that cannot be had, or
``DDPLAB_FORK_RANKS=0`` start the worker as torchrun would.
"""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

ENV = "DDPLAB_FORK_RANKS"                  # "0": every rank is a fresh python process
FORKED_ENV = "DDPLAB_RANK_FORKED_FROM"     # in a forked rank: the zygote's pid (the rank hook records it)
# what a DDP rank imports anyway, imported once by the warm process. Not torch._dynamo (which
# DDP's __init__ imports, as much CPU again): with it imported before the script, 8 of 55 runs of lab
# 01's fixed-sampler beside two busy loops hung at exit (the Reducer's dealloc, holding the GIL, joins
# gloo's worker thread, which waits for the GIL to free a finished work's thread-local state); 0 of
# 50 without it.
PRELOAD = ("torch", "torch.distributed", "torch.nn.parallel")
# torchrun's additions to a worker's environment that match warm.IMPORT_PREFIXES but are read when a
# process group is made, not at import
TORCHRUN_SET = frozenset({"TORCH_NCCL_ASYNC_ERROR_HANDLING"})
REPLY_S = 30.0
MAX_PACKET = 1 << 20
_PR_SET_PDEATHSIG, _PR_SET_CHILD_SUBREAPER = 1, 36

# the warm process's own sys.path without its first entry and its PYTHONPATH entries: what a fresh
# interpreter puts after the script's folder and PYTHONPATH (set by ``preload``)
_base_path: list[str] | None = None


def enabled() -> bool:
    return sys.platform.startswith("linux") and os.environ.get(ENV, "1") != "0"


def _pythonpath(env) -> list[str]:
    return [os.path.abspath(p) for p in (env.get("PYTHONPATH") or "").split(os.pathsep) if p]


def preload() -> None:
    """In the warm process, before any agent is forked: the imports every DDP rank makes."""
    global _base_path
    import importlib
    own = set(_pythonpath(os.environ))
    _base_path = [p for p in sys.path[1:] if os.path.abspath(p or ".") not in own]
    for name in PRELOAD:
        try:
            importlib.import_module(name)
        except Exception:   # noqa: BLE001 - an older torch: the rank imports what it needs itself
            pass


def _prctl(option: int, value: int) -> bool:
    try:
        import ctypes
        return ctypes.CDLL(None, use_errno=True).prctl(option, value) == 0
    except (OSError, AttributeError):
        return False


# ----------------------------------------------------------------------------------------------
# The agent's side
# ----------------------------------------------------------------------------------------------

class ForkedRank:
    """A forked rank, the agent's child after the middle process exits: the part of
    ``subprocess.Popen``'s interface torchrun uses (``pid``, ``poll``, ``wait``, ``returncode``,
    ``send_signal``, ``terminate``, ``kill``)."""

    def __init__(self, pid: int, args: list[str]):
        self.pid, self.args = pid, args
        self.returncode: int | None = None
        self._lock = threading.Lock()

    def _reap(self, flags: int) -> int | None:
        with self._lock:
            if self.returncode is None:
                try:
                    pid, status = os.waitpid(self.pid, flags)
                except ChildProcessError:      # not ours to wait for (never expected): judge by its pid
                    try:
                        os.kill(self.pid, 0)
                        return None
                    except ProcessLookupError:
                        self.returncode = -signal.SIGKILL
                        return self.returncode
                if pid:
                    self.returncode = os.waitstatus_to_exitcode(status)
            return self.returncode

    def poll(self) -> int | None:
        return self._reap(os.WNOHANG)

    def wait(self, timeout: float | None = None) -> int:
        end = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if end is not None and time.monotonic() >= end:
                raise subprocess.TimeoutExpired(self.args, timeout)
            time.sleep(0.01)
        return self.returncode  # type: ignore[return-value]

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:
                pass

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class _Client:
    """The agent's end of its zygote."""

    def __init__(self, sock: socket.socket, pid: int, import_environment, imports: dict[str, str]):
        self.sock, self.pid, self.imports = sock, pid, imports
        self.import_environment = import_environment
        self.lock = threading.Lock()
        self.broken = False

    def start(self, args: tuple, env: dict[str, str], stdout, stderr) -> ForkedRank | None:
        args = [str(a) for a in args]
        if self.broken or len(args) < 3 or args[0] != sys.executable or args[1] != "-u":
            return None
        if {k: v for k, v in self.import_environment(env).items() if k not in TORCHRUN_SET} != self.imports:
            return None
        fds = [stdout.fileno() if stdout else 1, stderr.fileno() if stderr else 2]
        msg = json.dumps({"argv": args[2:], "env": env, "cwd": os.getcwd()}).encode()
        if len(msg) > MAX_PACKET // 2:
            return None
        with self.lock:
            try:
                socket.send_fds(self.sock, [msg], fds)
                import select
                r, _, _ = select.select([self.sock], [], [], REPLY_S)
                reply = json.loads(self.sock.recv(MAX_PACKET) or b"{}") if r else {}
            except (OSError, ValueError):
                reply = {}
        if "pid" not in reply:
            self.broken = True
            return None
        return ForkedRank(reply["pid"], args)


def start(import_environment, imports: dict[str, str]):
    """In a run's agent, before torchrun starts: fork the zygote and have torchrun start its workers
    through it; a worker whose ``import_environment(env)`` (``ddplab.origins.warm``'s) is not
    ``imports`` starts as torchrun would. Returns None in the agent and, in a forked rank (which
    returns through here), the function that runs its script."""
    if not enabled() or _base_path is None:
        return None
    agent = os.getpid()
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        pid = os.fork()
    except OSError:
        ours.close()
        theirs.close()
        return None
    if pid == 0:
        ours.close()
        return _serve(theirs, agent)
    theirs.close()
    if not _prctl(_PR_SET_CHILD_SUBREAPER, 1):
        ours.close()              # the zygote sees the pair close and exits
        return None
    client = _Client(ours, pid, import_environment, dict(imports))
    from torch.distributed.elastic.multiprocessing.subprocess_handler import subprocess_handler as sh
    popen = sh.SubprocessHandler._popen

    def _popen(handler, args, env):
        proc = client.start(args, env, handler._stdout, handler._stderr)
        return proc if proc is not None else popen(handler, args, env)

    sh.SubprocessHandler._popen = _popen
    return None


# ----------------------------------------------------------------------------------------------
# The zygote, and the rank it forks
# ----------------------------------------------------------------------------------------------

def _serve(sock: socket.socket, agent: int):
    """The zygote's loop: one rank per request. Returns only in a forked rank."""
    _prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL))
    if os.getppid() != agent:
        os._exit(0)
    zygote = os.getpid()
    while True:
        try:
            data, fds, _flags, _addr = socket.recv_fds(sock, MAX_PACKET, 4)
        except OSError:
            data, fds = b"", []
        if not data:
            os._exit(0)           # the agent is gone
        req = json.loads(data)
        r, w = os.pipe()
        try:
            middle = os.fork()
        except OSError:
            middle = -1
        if middle == 0:
            os.close(r)
            try:
                rank = os.fork()
            except OSError:
                os._exit(1)
            if rank == 0:
                os.close(w)
                return _become_rank(sock, req, fds, zygote)
            os.write(w, str(rank).encode())
            os._exit(0)
        os.close(w)
        pid = os.read(r, 32) if middle > 0 else b""
        os.close(r)
        if middle > 0:
            os.waitpid(middle, 0)      # the rank is the agent's (the subreaper's) from here
        for f in fds:
            os.close(f)
        try:
            sock.send(json.dumps({"pid": int(pid)} if pid else {"error": "fork failed"}).encode())
        except OSError:
            os._exit(0)


def _become_rank(sock: socket.socket, req: dict, fds: list[int], zygote: int):
    """In the forked rank: the process as torchrun's Popen would have made it (before any script
    code runs); returns the function that runs the script."""
    sock.close()
    os.setsid()
    signal.signal(signal.SIGINT, signal.default_int_handler)
    for name in ("SIGTERM", "SIGCHLD", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2", "SIGALRM"):
        if hasattr(signal, name):
            signal.signal(getattr(signal, name), signal.SIG_DFL)
    os.dup2(fds[0], 1)
    os.dup2(fds[1], 2)
    keep = {0, 1, 2}
    for fd in [int(f) for f in os.listdir("/proc/self/fd")]:
        if fd not in keep:
            try:
                os.close(fd)
            except OSError:
                pass
    os.chdir(req["cwd"])
    os.environ.clear()
    os.environ.update(req["env"])
    os.environ[FORKED_ENV] = str(zygote)
    return lambda: _run_script(req["argv"])


def _run_script(argv: list[str]) -> None:
    """Run the script as ``__main__``, then leave through the interpreter's own exit."""
    import builtins
    import importlib.machinery
    import io
    import types

    script = argv[0]
    sys.argv = list(argv)
    sys.path[:] = [os.path.dirname(os.path.realpath(script)), *_pythonpath(os.environ), *(_base_path or [])]
    sys.stdout = sys.__stdout__ = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), encoding=sys.stdout.encoding,
                                                   errors="strict", write_through=True)
    sys.stderr = sys.__stderr__ = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), encoding=sys.stderr.encoding,
                                                   errors="backslashreplace", write_through=True)
    if os.environ.get("PYTHONFAULTHANDLER"):
        import faulthandler
        faulthandler.enable()
    if "numpy" in sys.modules:        # numpy seeds its global generator at import: a fresh one per rank
        sys.modules["numpy"].random.seed()
    threads = os.environ.get("OMP_NUM_THREADS", "")
    if threads.isdigit() and int(threads) > 0 and "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(int(threads))   # what torch read from it at import
    sys.modules.pop("sitecustomize", None)
    try:
        import sitecustomize  # noqa: F401  (the rank hook, first on the rank's PYTHONPATH)
    except ImportError as e:
        if e.name != "sitecustomize":
            raise

    main = types.ModuleType("__main__")
    main.__file__ = script
    main.__builtins__ = builtins
    main.__loader__ = importlib.machinery.SourceFileLoader("__main__", script)
    main.__spec__ = None
    main.__cached__ = None
    sys.modules["__main__"] = main
    with open(script, "rb") as f:
        code = compile(f.read(), script, "exec")
    try:
        exec(code, main.__dict__)
    except SystemExit:
        raise
    except BaseException as e:   # noqa: BLE001 - reported as an uncaught exception is, from the script's frame
        tb = e.__traceback__.tb_next if e.__traceback__ is not None else None
        sys.excepthook(type(e), e.with_traceback(tb), tb)
        raise SystemExit(1) from None
