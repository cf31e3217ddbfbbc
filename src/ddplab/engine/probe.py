"""Asking a running rank for evidence through torch's control-plane worker server.

The rank hook starts ``torch._C._distributed_c10d._WorkerServer`` on a Unix socket once the script
imports ``torch.distributed`` (a job can do the same itself with
``torch.distributed.elastic.control_plane.worker_main`` and ``TORCH_WORKER_SERVER_SOCKET``). Its
handlers answer HTTP POSTs ``/handler/<name>`` on a C++ thread, so they work while the rank's main
thread is blocked in a collective: ``fr_trace_json`` (the flight recorder's ledger), ``dump_traceback``
(every Python thread's stack, faulthandler format) and ddplab's ``ddplab_rendezvous``.

Plain ``http.client`` over an ``AF_UNIX`` socket; no torch import here (the launcher stays light).
"""
from __future__ import annotations

import http.client
import json
import socket


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
    gone, or busy past ``timeout_s``)."""
    conn = _UnixConnection(sock_path, timeout_s)
    try:
        conn.request("POST", f"/handler/{handler}")
        resp = conn.getresponse()
        body = resp.read()
        return body if resp.status == 200 else None
    except (OSError, http.client.HTTPException):
        return None
    finally:
        conn.close()


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


def rendezvous_target(sock_path: str, timeout_s: float = 2.0) -> dict | None:
    """{"host", "port", "func"} of the store a rank in the rendezvous is dialling, or None."""
    body = ask(sock_path, "ddplab_rendezvous", timeout_s)
    try:
        found = json.loads(body) if body else None
    except ValueError:
        return None
    return found or None
