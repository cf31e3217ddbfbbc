"""Asking a running rank for evidence through torch's control-plane worker server.

The rank hook starts ``torch._C._distributed_c10d._WorkerServer`` on a Unix socket once the script
imports ``torch.distributed`` (a job can do the same itself with
``torch.distributed.elastic.control_plane.worker_main`` and ``TORCH_WORKER_SERVER_SOCKET``). Its
handlers answer HTTP POSTs ``/handler/<name>`` on a C++ thread, so they work while the rank's main
thread is blocked in a collective: ``fr_trace_json`` (the flight recorder's ledger), ``dump_traceback``
(every Python thread's stack, faulthandler format) and ddplab's ``ddplab_rendezvous``.

Plain ``http.client`` over an ``AF_UNIX`` socket; no torch import here (the launcher stays light).

A request holds ``runfiles.probe_lock(socket)`` shared until the rank has answered it, also after
the caller has stopped waiting (``timeout_s``): a reaper thread keeps the connection until the answer
comes. The rank, as it exits, removes its socket and takes that lock exclusively before it shuts the
server down, because the server's ``shutdown()`` keeps the GIL while it waits for a handler in
flight, and the handlers need the GIL: shutting down with one in flight hung the rank, and a handler
left to run during the interpreter's finalization aborts it. A rank that is exiting (the lock
taken) is not asked: ``ask`` returns None. The rank makes the lock file before its server starts, and
``ask`` opens it without creating it: a prober never leaves a lock file in a gone rank's folder. A
socket with no lock file beside it is a server without ddplab's hook (torch's own ``worker_main``):
asked without one. Nor is one whose last request from this process is
still unanswered after ``timeout_s``: the new request would wait for the same GIL.
"""
from __future__ import annotations

import fcntl
import http.client
import json
import os
import socket
import threading
import time

from ddplab import runfiles

# sockets with a request of this process still unanswered: set when its reaper has the answer
_unanswered: dict[str, threading.Event] = {}
_unanswered_guard = threading.Lock()


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float):
        super().__init__("localhost", timeout=timeout)
        self._path = path

    def connect(self) -> None:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(self.timeout)
        s.connect(self._path)
        self.sock = s


def ask(sock_path: str, handler: str, timeout_s: float = 2.0) -> bytes | None:
    """The body of ``handler``'s answer, or None when the rank does not answer (no server yet,
    gone, exiting, or busy past ``timeout_s``)."""
    deadline = time.monotonic() + timeout_s
    with _unanswered_guard:
        earlier = _unanswered.get(sock_path)
    if earlier is not None and not earlier.wait(timeout_s):
        return None
    timeout_s = deadline - time.monotonic()
    if timeout_s <= 0:
        return None
    try:
        lock = os.open(runfiles.probe_lock(sock_path), os.O_RDWR)   # the rank made it (never re-created here)
    except OSError:
        if not os.path.exists(sock_path):
            return None      # no server yet, or the rank and its folder are gone
        lock = None          # a server without ddplab's hook (torch's own worker_main): no lock to hold
    if lock is not None:
        try:
            fcntl.flock(lock, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError:      # the rank is exiting: it holds the lock until it is gone
            os.close(lock)
            return None
    conn = _UnixConnection(sock_path, timeout_s)
    try:
        conn.request("POST", f"/handler/{handler}")
        resp = conn.getresponse()
        body = resp.read()
        return body if resp.status == 200 else None
    except TimeoutError:
        # sent, not answered yet: the handler may still be waiting for the rank's GIL
        if conn.sock is not None:
            sock, conn.sock = conn.sock, None
            answered = threading.Event()
            with _unanswered_guard:
                _unanswered[sock_path] = answered
            threading.Thread(target=_reap, args=(sock_path, sock, lock, answered), daemon=True,
                             name="ddplab-probe-reaper").start()
            lock = None
        return None
    except (OSError, http.client.HTTPException):
        return None
    finally:
        conn.close()
        if lock is not None:
            os.close(lock)        # and with it the shared lock


def _reap(sock_path: str, sock: socket.socket, lock: int | None, answered: threading.Event) -> None:
    """Keep a timed-out request's connection and lock until the rank answers (the server writes its
    answer once the handler has returned) or the connection ends (the rank is gone)."""
    try:
        sock.settimeout(None)
        sock.recv(1)
    except OSError:
        pass
    finally:
        sock.close()
        if lock is not None:
            os.close(lock)
        with _unanswered_guard:
            if _unanswered.get(sock_path) is answered:
                del _unanswered[sock_path]
        answered.set()


def ledger(sock_path: str, timeout_s: float = 2.0) -> dict | None:
    """The flight recorder's dump as torch writes it (``entries``, ``pg_status``, ``pg_config``)."""
    body = ask(sock_path, "fr_trace_json", timeout_s)
    try:
        return json.loads(body) if body else None
    except ValueError:
        return None


def traceback(sock_path: str, timeout_s: float = 2.0) -> str | None:
    """Every Python thread's stack, in faulthandler's format."""
    body = ask(sock_path, "dump_traceback", timeout_s)
    return body.decode(errors="replace") if body else None


def rank_channels(sock_path: str, timeout_s: float = 2.0) -> dict | None:
    """{"calls", "threads"}: the rank hook's call records and every thread's stack, or None."""
    body = ask(sock_path, "ddplab_rank", timeout_s)
    try:
        found = json.loads(body) if body else None
    except ValueError:
        return None
    return found if isinstance(found, dict) else None


def rendezvous_target(sock_path: str, timeout_s: float = 2.0) -> dict | None:
    """{"host", "port", "func"} of the store a rank in the rendezvous is dialling, or None."""
    body = ask(sock_path, "ddplab_rendezvous", timeout_s)
    try:
        found = json.loads(body) if body else None
    except ValueError:
        return None
    return found or None
