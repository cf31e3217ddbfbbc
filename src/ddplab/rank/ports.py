"""Is a TCP port free on this machine, and if not, who holds it (psutil, not netstat).

Used by the launcher (``ddplab.origins.job``), the tools, the course and lab 05's ranks: it imports only
the standard library and psutil, never torch."""
from __future__ import annotations

import errno
import socket
from dataclasses import dataclass

import psutil


@dataclass(frozen=True)
class PortStatus:
    port: int
    free: bool
    pid: int | None = None
    process: str | None = None      # process name, e.g. "python"
    cmdline: str | None = None

    def describe(self) -> str:
        if self.free:
            return f"port {self.port} is free"
        who = f" by pid {self.pid} ({self.process})" if self.pid else " by another process (its owner is not visible to this user)"
        return f"port {self.port} is taken{who}"

    def to_dict(self) -> dict:
        return {"port": self.port, "free": self.free, "pid": self.pid, "process": self.process, "cmdline": self.cmdline}


def holder(port: int) -> tuple[int | None, str | None, str | None]:
    """The process listening on ``port`` (pid, name, command line), or Nones if unknown."""
    try:
        conns = psutil.net_connections(kind="tcp")
    except (psutil.AccessDenied, OSError):
        return None, None, None
    for c in conns:
        if c.laddr and c.laddr.port == port and c.status == psutil.CONN_LISTEN and c.pid:
            try:
                p = psutil.Process(c.pid)
                return c.pid, p.name(), " ".join(p.cmdline())[:200]
            except psutil.Error:
                return c.pid, None, None
    return None, None, None


def check_port(port: int, host: str = "127.0.0.1") -> PortStatus:
    """Try to bind ``host:port`` the way the rendezvous store will; name the holder if it fails."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError as e:
            if e.errno not in (errno.EADDRINUSE, errno.EACCES):
                raise
            pid, name, cmd = holder(port)
            return PortStatus(port, False, pid, name, cmd)
    # Bound on the host: also check a listener on all interfaces (the store binds 0.0.0.0/::).
    pid, name, cmd = holder(port)
    if pid is not None:
        return PortStatus(port, False, pid, name, cmd)
    return PortStatus(port, True)


def free_port(host: str = "127.0.0.1") -> int:
    """A port the OS says is free now (bind port 0). Another process may take it before use;
    the launcher passes port 0 to torchrun instead wherever it can, which has no such race."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]
