"""Warm torchrun agents: each run's agent is a fork of a process that has already imported torch.

A torchrun agent spends nearly all of its CPU importing torch (1.2-1.5 CPU-s here, against about
0.05 for the rest of a short job's supervision), and a notebook starts one per run. So the launcher
keeps one *warm* process (``python -m ddplab.origins._torchrun --warm FD``, a child of the launcher in a
session of its own) that imports ``torch.distributed.run`` once and then forks one agent per run. The
agent is still torchrun: ``ddplab.origins._torchrun.main`` runs ``torch.distributed.run``'s own parser and
agent with the run's arguments, environment, working folder and console file; the ranks it starts
are fresh ``python script.py`` processes, as always. Only the agent's import happened earlier.

What differs, and where it is said: a warm agent's command line (``ps``) is its warm parent's; the
run's real torchrun command is in the run folder's ``command.json``. A run goes cold (a plain
``subprocess.Popen`` of the same command) when it asks for an environment torch reads at import
(``TORCH_*``, ``LOGLEVEL``, ``PYTHON*`` other than what the launcher sets for each run) that differs
from the warm process's; on any platform but Linux (fork after importing torch is unsafe on macOS);
when ``DDPLAB_WARM_AGENT=0``; or when the warm process cannot be had.

Protocol (one ``AF_UNIX`` ``SOCK_SEQPACKET`` pair, one JSON message per packet): the warm process
says ``{"ready": pid}`` once imported; the launcher sends ``{"argv", "env", "cwd"}`` with the console
file's descriptor; the warm process answers ``{"pid": N}`` and, when that agent ends, ``{"exit": N,
"code": C}`` (``C`` as ``Popen.returncode``: negative for a signal). The warm process exits when the
launcher's end of the pair closes (the launcher ended, however it ended).
"""
from __future__ import annotations

import atexit
import json
import os
import select
import socket
import subprocess
import sys
import threading
import time

from ddplab.origins import envutil

ENV = "DDPLAB_WARM_AGENT"
# Variables the launcher sets for each run (job.launch_environment): they matter to the ranks, and
# the agent reads them after the fork, not at import.
PER_RUN = frozenset({"PYTHONPATH", "PYTHONUNBUFFERED", "PYTHONFAULTHANDLER", "TORCH_FR_BUFFER_SIZE"})
IMPORT_PREFIXES = ("TORCH_", "PYTORCH_", "LOGLEVEL", "PYTHON", "LD_PRELOAD", "LD_LIBRARY_PATH")
AGENT = [sys.executable, "-m", "ddplab.origins._torchrun"]   # how job.torchrun_command starts an agent
READY_S = 60.0          # the warm process's import: 1.5 s here; a loaded machine takes longer
MAX_PACKET = 1 << 20


def import_environment(env: dict[str, str]) -> dict[str, str]:
    """The part of an environment that torch or Python read at import time (what a warm agent
    cannot change after the fork)."""
    return {k: v for k, v in env.items() if k.startswith(IMPORT_PREFIXES) and k not in PER_RUN}


def enabled() -> bool:
    return sys.platform.startswith("linux") and os.environ.get(ENV, "1") != "0" and hasattr(socket, "send_fds")


class WarmProcess:
    """The handle of one forked agent, with the part of ``subprocess.Popen``'s interface the
    launcher uses (``pid``, ``poll``, ``wait``, ``returncode``)."""

    def __init__(self, server: "Server", pid: int, args: list[str]):
        self.server, self.pid, self.args = server, pid, args
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self.server.exit_code(self.pid)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        end = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if end is not None and time.monotonic() >= end:
                raise subprocess.TimeoutExpired(self.args, timeout)
            time.sleep(0.02)
        return self.returncode  # type: ignore[return-value]


class Server:
    """The launcher's side of one warm process."""

    def __init__(self):
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        env = dict(os.environ)
        self.imports = import_environment(env)
        try:
            self.proc = subprocess.Popen([*AGENT, "--warm", str(theirs.fileno())],
                                         pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL,
                                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env,
                                         start_new_session=True)
        finally:
            theirs.close()
        self.sock = ours
        self.lock = threading.Lock()
        self.exits: dict[int, int] = {}
        self.ready = False
        self.broken = False

    # -- messages ---------------------------------------------------------------------------------
    def _read(self, timeout: float) -> dict | None:
        """One message (None if none came within ``timeout``); a closed pair marks the server broken."""
        r, _, _ = select.select([self.sock], [], [], timeout)
        if not r:
            return None
        try:
            data = self.sock.recv(MAX_PACKET)
        except OSError:
            data = b""
        if not data:
            self.broken = True
            return None
        msg = json.loads(data)
        if "exit" in msg:
            self.exits[msg["exit"]] = msg["code"]
        elif "ready" in msg:
            self.ready = True
        return msg

    def _drain(self) -> None:
        while not self.broken and self._read(0.0) is not None:
            pass

    def exit_code(self, pid: int) -> int | None:
        with self.lock:
            if pid not in self.exits and not self.broken:
                self._drain()
            if pid in self.exits:
                return self.exits.pop(pid)
            if self.broken:
                # the warm process is gone, so nobody can report this agent's end: judge by its pid
                try:
                    os.kill(pid, 0)
                except ProcessLookupError:
                    return -9
                except PermissionError:
                    pass
            return None

    def wait_ready(self, timeout: float = READY_S) -> bool:
        end = time.monotonic() + timeout
        with self.lock:
            while not self.ready and not self.broken and time.monotonic() < end:
                self._read(min(0.1, max(0.0, end - time.monotonic())))
                if self.proc.poll() is not None:
                    self.broken = True
        return self.ready and not self.broken

    def start(self, cmd: list[str], env: dict[str, str], console_fd: int) -> WarmProcess | None:
        """Fork an agent for ``cmd`` (``AGENT + torchrun's arguments``); None when it cannot be
        done warm (the caller starts it cold)."""
        if import_environment(env) != self.imports:
            return None
        if not self.wait_ready():
            return None
        msg = json.dumps({"argv": cmd[3:], "env": env, "cwd": os.getcwd()}).encode()
        if len(msg) > MAX_PACKET // 2:
            return None
        with self.lock:
            try:
                socket.send_fds(self.sock, [msg], [console_fd])
            except OSError:
                self.broken = True
                return None
            end = time.monotonic() + READY_S
            interrupted = None
            while time.monotonic() < end and not self.broken:
                try:
                    reply = self._read(0.1)
                except KeyboardInterrupt as e:   # the agent may be forked already: end it, then go on
                    interrupted = e
                    continue
                if reply and "pid" in reply:
                    if interrupted is not None:
                        _kill_group(reply["pid"])
                        raise interrupted
                    return WarmProcess(self, reply["pid"], cmd)
                if reply and "error" in reply:
                    break
            if interrupted is not None:
                raise interrupted
        return None

    def close(self) -> None:
        try:
            self.sock.close()
        finally:
            try:
                self.proc.wait(timeout=2)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=2)


def _kill_group(pid: int) -> None:
    import signal
    try:
        os.killpg(pid, signal.SIGKILL)   # the agent leads a session (and group) of its own
    except (ProcessLookupError, PermissionError):
        pass


_server: Server | None = None
_server_lock = threading.Lock()


def _forget_after_fork() -> None:
    """In a child forked from a launcher (a ProcessPoolExecutor worker, say): the parent's warm
    process is not this one's to use, and this copy of the pair must not keep it alive."""
    global _server, _server_lock
    if _server is not None:
        try:
            _server.sock.close()
        except OSError:
            pass
    _server, _server_lock = None, threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_after_fork)


def server() -> Server | None:
    """This process's warm process, started on first use (None where warm agents are off)."""
    global _server
    if not enabled():
        return None
    with _server_lock:
        if _server is not None and (_server.broken or _server.proc.poll() is not None
                                    or _server.imports != import_environment(dict(os.environ))):
            # gone, or this process's environment changed what torch would read at import: a new one
            _server.close()
            _server = None
        if _server is None:
            try:
                _server = Server()
            except OSError:
                return None
            atexit.register(_server.close)
        return _server


def start(cmd: list[str], env: dict[str, str], console) -> "WarmProcess | subprocess.Popen":
    """The job's parent process: a torchrun agent forked warm where it can be, else ``cmd`` by
    ``subprocess.Popen`` (own session, stdin from /dev/null, stdout and stderr to ``console``), as
    any other command is (a multi-node job's ``python -m ddplab.origins.cluster agents``)."""
    srv = server() if cmd[:len(AGENT)] == AGENT else None
    if srv is not None:
        proc = srv.start(cmd, env, console.fileno())
        if proc is not None:
            return proc
    return subprocess.Popen(envutil.ending_with_this_process(cmd), stdout=console, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, env=env, start_new_session=True)


# ----------------------------------------------------------------------------------------------
# The warm process (python -m ddplab.origins._torchrun --warm FD)
# ----------------------------------------------------------------------------------------------

def serve(fd: int, main) -> None:
    """The warm process: fork one agent per request, each running ``main(argv)`` (``_torchrun.main``,
    handed in by ``_torchrun``'s own entry point, so this module imports nothing of it)."""
    import signal
    import warnings

    filters = list(warnings.filters)                      # the agent gets a fresh process's filters back
    warnings.simplefilter("ignore", DeprecationWarning)   # Python 3.12+: fork() with torch's helper thread
    signal.signal(signal.SIGINT, signal.SIG_IGN)          # the launcher ends it by closing the pair
    sock = socket.socket(fileno=fd)
    import torch.distributed.run  # noqa: F401  (the import every agent would make)

    def send(msg: dict) -> bool:
        try:
            sock.send(json.dumps(msg).encode())
            return True
        except OSError:
            return False

    server = os.getpid()
    send({"ready": server})
    children: set[int] = set()
    while True:
        r, _, _ = select.select([sock], [], [], 0.05)
        if r:
            try:
                data, fds, _flags, _addr = socket.recv_fds(sock, MAX_PACKET, 4)
            except OSError:
                data, fds = b"", []
            if not data:
                break    # the launcher is gone
            try:
                req = json.loads(data)
                pid = os.fork()
            except Exception as e:   # noqa: BLE001 - said to the launcher, which starts the agent cold
                for f in fds:
                    os.close(f)
                send({"error": f"{type(e).__name__}: {e}"})
                continue
            if pid == 0:
                warnings.filters[:] = filters
                _agent(sock, req, fds, main, server)
            for f in fds:
                os.close(f)
            children.add(pid)
            send({"pid": pid})
        while children:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                children.clear()
                break
            if pid == 0:
                break
            children.discard(pid)
            send({"exit": pid, "code": os.waitstatus_to_exitcode(status)})
    sock.close()


def _end_with(server: int) -> None:
    """Linux: SIGTERM this agent when the warm process exits, which it does when its launcher is gone.
    A run whose launcher was killed mid-run (a notebook kernel restarted or killed, a CLI killed) then
    ends as torchrun ends on SIGTERM, its workers with it, instead of running on unwatched."""
    import signal
    try:
        import ctypes
        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGTERM))    # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if os.getppid() != server:          # the warm process went before the line above
        os.kill(os.getpid(), signal.SIGTERM)


def _agent(sock: socket.socket, req: dict, fds: list[int], main, server: int) -> None:
    """In the forked child: become the run's torchrun agent, exactly as a fresh process would be."""
    import random
    import signal
    import traceback

    code = 1
    try:
        sock.close()
        os.setsid()
        _end_with(server)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.close(devnull)
        os.dup2(fds[0], 1)
        os.dup2(fds[0], 2)
        os.close(fds[0])
        os.chdir(req["cwd"])
        os.environ.clear()
        os.environ.update(req["env"])
        random.seed()
        sys.argv = ["-m", *req["argv"]]
        sys.stdout.reconfigure(line_buffering=True)   # as PYTHONUNBUFFERED would have it, near enough
        try:
            main(req["argv"])
            code = 0
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
            if isinstance(e.code, str):
                print(e.code, file=sys.stderr)
        except BaseException:   # noqa: BLE001 - printed as an uncaught exception would be
            traceback.print_exc()
            code = 1
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:   # noqa: BLE001
                pass
        os._exit(code)
