"""Pre-flight for a multi-node run: is the master reachable, is its port usable, do the ranks agree?

Launcher side (no torch import): ``preflight(master_addr, port)`` dials ``master_addr:port`` over TCP
(or, when the address is this machine's, checks that the port is free to bind), then runs this same
file on ``nproc`` local ranks through ``ddplab.run``; every rank records what it was launched with
(WORLD_SIZE, LOCAL_WORLD_SIZE, its node, torch, Python) and compares it with the others' through
torchrun's own store, before and without init_process_group (``ddplab.rank.agreement``): ranks given
different WORLD_SIZE would wait in init_process_group for each other until its timeout.

Rank side, on a real cluster (every node, the same command):

    torchrun --nnodes 2 --nproc-per-node 8 --rdzv-backend c10d --rdzv-endpoint $MASTER:29500 \
             -m ddplab.tools.preflight
"""
from __future__ import annotations

import errno
import os
import socket
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import psutil

from ddplab.rank import agreement
from ddplab.rank import ports
from ddplab.rank.agreement import Disagreement, Launched
from ddplab.defaults import TORCHRUN_PORT
from ddplab.errors import DdplabError


@dataclass(frozen=True)
class PortCheck:
    host: str
    port: int
    state: str          # "free" / "taken" (this machine), "open" / "refused" / "no-answer" / "unreachable" (remote)
    seconds: float
    detail: str

    @property
    def reachable(self) -> bool:
        """An answer came back: the host is there and nothing dropped the packets."""
        return self.state in ("free", "open", "refused")

    def to_dict(self) -> dict:
        return {**asdict(self), "reachable": self.reachable}


@dataclass(frozen=True)
class RankReport:
    launched: Launched       # what this rank was launched with (its own record)
    peers_agree: bool | None  # every rank it saw agreed with it and all arrived (None: it recorded no view)

    @property
    def rank(self) -> int:
        return self.launched.rank

    @property
    def world_size(self) -> int:
        return self.launched.world_size

    @property
    def torch(self) -> str:
        return self.launched.torch

    def to_dict(self) -> dict:
        return {**self.launched.to_dict(), "peers_agree": self.peers_agree}


@dataclass(frozen=True)
class Preflight:
    master_addr: str
    port: int
    master: PortCheck
    ranks: tuple[RankReport, ...]
    nproc: int
    run_status: str | None   # the rank-side job's RunResult.status (None when not run)
    run_dir: str | None
    problems: tuple[str, ...]
    disagreements: tuple[Disagreement, ...] = ()   # the ranks' records compared (ddplab.rank.agreement), as data

    @property
    def ok(self) -> bool:
        return not self.problems

    @property
    def torch_versions(self) -> tuple[str, ...]:
        return tuple(sorted({r.torch for r in self.ranks}))

    @property
    def world_sizes(self) -> tuple[int, ...]:
        return tuple(sorted({r.world_size for r in self.ranks}))

    def to_dict(self) -> dict:
        return {"master_addr": self.master_addr, "port": self.port, "master": self.master.to_dict(),
                "ranks": [r.to_dict() for r in self.ranks], "nproc": self.nproc, "run_status": self.run_status,
                "run_dir": self.run_dir, "problems": list(self.problems), "ok": self.ok,
                "disagreements": [d.to_dict() for d in self.disagreements],
                "torch_versions": list(self.torch_versions), "world_sizes": list(self.world_sizes)}

    def explain(self) -> str:
        lines = [f"pre-flight for {self.master_addr}:{self.port}: {'OK' if self.ok else 'PROBLEMS'}",
                 f"  master: {self.master.detail}"]
        if self.ranks:
            lines.append(f"  ranks: {len(self.ranks)} reported; torch {', '.join(self.torch_versions)}; "
                         f"WORLD_SIZE {', '.join(map(str, self.world_sizes))}")
        lines += [f"  problem: {p}" for p in self.problems]
        return "\n".join(lines)


def _local_addresses() -> set[str]:
    out = {"localhost", "0.0.0.0"}
    for addrs in psutil.net_if_addrs().values():
        out.update(a.address.split("%")[0] for a in addrs if a.family in (socket.AF_INET, socket.AF_INET6))
    return out


def check_master(master_addr: str, port: int, timeout_s: float = 3.0) -> PortCheck:
    """From this machine: can ``master_addr:port`` be reached (before the job starts)?

    On this machine: the port must be free for the store to bind (who holds it, if not). Elsewhere:
    one TCP connect. "open" (something listens), "refused" (reachable, nothing listens yet: fine
    before the job, the master's store will listen there), "no-answer" (packets dropped: a firewall
    or a wrong address), "unreachable" (no route to it).
    """
    if not 0 < int(port) <= 65535:
        raise DdplabError(f"port {port} is not a TCP port", hint="use the MASTER_PORT you will launch with, e.g. 29500")
    if not timeout_s > 0:
        raise DdplabError(f"timeout {timeout_s!r} must be more than 0 seconds", hint="for example 3")
    t0 = time.monotonic()
    try:
        infos = socket.getaddrinfo(master_addr, port, type=socket.SOCK_STREAM)
    except socket.gaierror as e:
        return PortCheck(master_addr, port, "unreachable", 0.0, f"{master_addr} does not resolve ({e.strerror})")
    ip = infos[0][4][0]
    if master_addr in _local_addresses() or ip in _local_addresses() or ip.startswith("127."):
        st = ports.check_port(port, ip if not ip.startswith("0.") else "127.0.0.1")
        return PortCheck(master_addr, port, "free" if st.free else "taken", round(time.monotonic() - t0, 3),
                         f"{master_addr} is this machine; {st.describe()}")
    return dial(master_addr, port, timeout_s, infos[0], t0)


def dial(master_addr: str, port: int, timeout_s: float = 3.0, info=None, t0: float | None = None) -> PortCheck:
    """One TCP connect to ``master_addr:port``, wherever it is: open, refused, no-answer or unreachable."""
    t0 = time.monotonic() if t0 is None else t0
    if info is None:
        try:
            info = socket.getaddrinfo(master_addr, port, type=socket.SOCK_STREAM)[0]
        except socket.gaierror as e:
            return PortCheck(master_addr, port, "unreachable", 0.0, f"{master_addr} does not resolve ({e.strerror})")
    family, kind, proto, _, addr = info
    with socket.socket(family, kind, proto) as s:
        s.settimeout(timeout_s)
        try:
            s.connect(addr)
            state, detail = "open", f"{master_addr}:{port} accepts connections (a store already listens there?)"
        except socket.timeout:
            state, detail = "no-answer", (f"no answer from {master_addr}:{port} in {timeout_s:g} s: packets dropped "
                                          "(a firewall, or an address where nothing is)")
        except ConnectionRefusedError:
            state, detail = "refused", (f"{master_addr} answered, nothing listens on {port} yet "
                                        "(fine before the job starts: the store will listen there)")
        except OSError as e:
            if e.errno in (errno.EHOSTUNREACH, errno.ENETUNREACH, errno.EINVAL, errno.EACCES, errno.EPERM):
                state, detail = "unreachable", f"{master_addr} is unreachable from here ({e.strerror})"
            else:
                raise
    return PortCheck(master_addr, port, state, round(time.monotonic() - t0, 3), detail)


LOCAL_WAIT_S = 30.0     # how long each local rank waits for its peers' records at most


def preflight(master_addr: str = "127.0.0.1", port: int = TORCHRUN_PORT, nproc: int = 2, timeout_s: float = 3.0,
              run_ranks: bool = True, run_root: str | Path | None = None, deadline_s: float = 90.0) -> Preflight:
    """Everything a learner should know before a multi-node run, as a frozen Preflight (``to_dict()``).

    ``master_addr:port`` is checked from this machine (``check_master``); then, unless
    ``run_ranks=False``, ``nproc`` local ranks run this file through ``ddplab.run`` and report
    what they were launched with and compare it (``ddplab.rank.agreement``). ``problems`` lists what would
    stop a run (empty: go).
    """
    master = check_master(master_addr, port, timeout_s)
    problems = []
    if master.state == "taken":
        problems.append(f"{master.detail}: the store cannot bind it; pick another MASTER_PORT")
    elif not master.reachable:
        problems.append(master.detail)
    ranks: tuple[RankReport, ...] = ()
    found: tuple[Disagreement, ...] = ()
    status = run_dir = None
    if run_ranks:
        # the ranks of one machine all arrive, and the wait ends when they have: its bound is for ranks that
        # never come (they disagree on WORLD_SIZE), and must outlast a peer's start-up on a loaded machine
        # (5 s did not in a CI run: one rank gave up before the other had imported torch)
        r = run_rank_side(max(timeout_s, LOCAL_WAIT_S), nproc=nproc, deadline_s=deadline_s, run_root=run_root)
        status, run_dir = r.status, r.run_dir
        if r.status != "ok":
            problems.append(f"the rank-side check did not finish: {r.status}"
                            + (f" [{r.signature}]" if r.signature else "") + f" (see {r.run_dir})")
        ranks, seen = rank_reports(r)
        found = seen.disagreements
        problems += seen.problems()
    return Preflight(master_addr, int(port), master, ranks, nproc, status, run_dir, tuple(problems), found)


def run_rank_side(wait_s: float, **kw) -> "ddplab.RunResult":
    """This file's rank side under ``ddplab.run`` (``preflight()`` here, ``lab09.launch_check`` on a
    cluster): each rank waits at most ``wait_s`` for the others' records, and the stall window outlasts
    that wait, since a rank polling the store is not stuck. Other keywords go to ddplab.run."""
    import ddplab

    return ddplab.run(Path(__file__), stall_s=wait_s + 5, args=("--timeout-s", str(wait_s)), **kw)


def rank_reports(result) -> tuple[tuple[RankReport, ...], "agreement.Agreement"]:
    """A rank-side run's records: each rank's report (own record and whether what it saw agreed) and
    the Agreement of every rank's record compared (``ddplab.rank.agreement``)."""
    views = {(p["rank"], p["pid"]): p for p in result.records_of("preflight-peers")}
    own = [Launched.from_dict(rec) for rec in result.records_of("preflight")]
    found = agreement.from_run(result)
    reports = tuple(RankReport(x, (not v["disagreements"] and v["complete"]) if (v := views.get((x.rank, x.pid)))
                               else None) for x in sorted(own, key=lambda x: (x.rank, x.key)))
    return reports, found


def _rank_main(timeout_s: float) -> None:
    """Every rank: record what it was launched with first, then compare with the others through
    torchrun's store, waiting at most ``timeout_s`` for them; no init_process_group, which ranks that
    disagree on WORLD_SIZE would wait in together until its timeout."""
    from ddplab.rank import lab

    me = Launched.here()
    lab.record("preflight", **me.to_dict())
    seen, waited, complete = agreement.exchange(agreement.torchrun_store(timeout_s), me, wait_s=timeout_s)
    found = agreement.compare(seen)
    lab.record("preflight-peers", pid=me.pid, seen=[x.to_dict() for x in seen], waited_s=waited, complete=complete,
               disagreements=[d.to_dict() for d in found])
    if os.environ.get("LOCAL_RANK") == "0":     # one line a node, for whoever reads this node's output
        lab.log(f"pre-flight: {len(seen)} ranks seen in {waited:.1f} s: "
                + (" | ".join(d.sentence() for d in found) or ("all agree" if complete else "some did not arrive")))


if __name__ == "__main__":
    import argparse

    p = argparse.ArgumentParser(description="ddplab pre-flight, rank side (run it with torchrun on every node)")
    p.add_argument("--timeout-s", type=float, default=10.0,
                   help="seconds to wait for the other ranks' records in torchrun's store")
    a = p.parse_args()
    if "RANK" not in os.environ:
        raise SystemExit("run this with torchrun (it sets RANK and WORLD_SIZE): "
                         "torchrun --nproc-per-node 2 -m ddplab.tools.preflight")
    _rank_main(a.timeout_s)


# ----------------------------------------------------------------------------------------------
# The network between nodes, before the job (`ddplab doctor --preflight --network`, lab 09)
# ----------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class NetworkCheck:
    """One node's view of the network it will train over, checked before the job starts.

    ``data`` is a connection to a random port the master's pre-flight server opened (``serve_network``
    on node 0), standing for the random ports torchrun's workers' store and gloo listen on; None when
    the rendezvous port did not answer with one."""
    hostname: str
    resolves_to: str | None
    gloo_ifname: str | None
    gloo_address: str | None
    rendezvous: PortCheck
    data: PortCheck | None

    @property
    def hostname_loopback(self) -> bool:
        return self.gloo_ifname is None and (self.resolves_to or "").startswith("127.")

    def faults(self) -> list[str]:
        out = []
        if self.hostname_loopback:
            out.append(f"hostname {self.hostname} resolves to {self.resolves_to}: gloo would listen on loopback and "
                       "tell the other nodes to dial it; set GLOO_SOCKET_IFNAME to the interface the nodes share")
        if self.gloo_ifname is not None and self.gloo_address is None:
            out.append(f"GLOO_SOCKET_IFNAME={self.gloo_ifname} is not an interface with an IPv4 address here")
        if self.rendezvous.state != "open":
            out.append(f"rendezvous {self.rendezvous.host}:{self.rendezvous.port}: {self.rendezvous.detail}")
        elif self.data is None:
            out.append("the master's pre-flight server did not say which data port to try (is it `--serve`?)")
        elif self.data.state != "open":
            out.append(f"data port {self.data.host}:{self.data.port} (a random port, as the workers' store and "
                       f"gloo use): {self.data.detail}; open the cluster's subnet between the nodes, not one port")
        return out

    @property
    def ok(self) -> bool:
        return not self.faults()

    def to_dict(self) -> dict:
        return {"hostname": self.hostname, "resolves_to": self.resolves_to, "gloo_ifname": self.gloo_ifname,
                "gloo_address": self.gloo_address, "rendezvous": self.rendezvous.to_dict(),
                "data": self.data.to_dict() if self.data else None, "faults": self.faults(), "ok": self.ok}

    def explain(self) -> str:
        head = (f"network pre-flight from {self.hostname} ({self.resolves_to}); gloo would use "
                f"{self.gloo_address or '?'}" + (f" ({self.gloo_ifname})" if self.gloo_ifname else " (from the hostname)"))
        return "\n".join([head] + ([f"  FAULT: {f}" for f in self.faults()] or ["  ok: rendezvous and a data port answer"]))


def _ifname_address(name: str) -> str | None:
    for a in psutil.net_if_addrs().get(name, []):
        if a.family == socket.AF_INET:
            return a.address
    return None


def network_check(master_addr: str, port: int, timeout_s: float = 3.0) -> NetworkCheck:
    """From a node, before the job: what the hostname resolves to (gloo's address without
    GLOO_SOCKET_IFNAME), the rendezvous port, and a random data port on the master (asked of the
    master's ``serve_network`` over the rendezvous port)."""
    host = socket.gethostname()
    try:
        resolved = socket.gethostbyname(host)
    except OSError:
        resolved = None
    ifname = os.environ.get("GLOO_SOCKET_IFNAME") or None
    gloo_addr = _ifname_address(ifname) if ifname else resolved
    t0 = time.monotonic()
    data_port = None
    try:
        with socket.create_connection((master_addr, port), timeout=timeout_s) as s:
            s.settimeout(timeout_s)
            line = s.makefile().readline().strip()
            data_port = int(line) if line.isdigit() else None
        rdzv = PortCheck(master_addr, port, "open", round(time.monotonic() - t0, 3),
                         f"{master_addr}:{port} accepts connections")
    except OSError:
        rdzv = check_master(master_addr, port, timeout_s)
        if rdzv.state == "open":
            rdzv = PortCheck(master_addr, port, "no-answer", rdzv.seconds, "the rendezvous port answered, then closed")
    data = dial(master_addr, data_port, timeout_s) if data_port else None
    return NetworkCheck(host, resolved, ifname, gloo_addr, rdzv, data)


def serve_network(port: int, clients: int = 1, timeout_s: float = 30.0, ready=None) -> int:
    """On the master node: listen on the rendezvous ``port`` and on a random port; tell each node that
    connects to ``port`` which random port to try, and accept there. Returns how many nodes reached
    the random port before ``clients`` were served or ``timeout_s`` ran out."""
    import selectors
    rdzv = socket.create_server(("0.0.0.0", port), reuse_port=False)
    data = socket.create_server(("0.0.0.0", 0))
    dport = data.getsockname()[1]
    sel = selectors.DefaultSelector()
    sel.register(rdzv, selectors.EVENT_READ, "rdzv")
    sel.register(data, selectors.EVENT_READ, "data")
    if ready is not None:
        ready(dport)
    reached, end = 0, time.monotonic() + timeout_s
    try:
        while reached < clients and time.monotonic() < end:
            for key, _ in sel.select(timeout=0.2):
                conn, _ = key.fileobj.accept()
                with conn:
                    if key.data == "rdzv":
                        conn.sendall(f"{dport}\n".encode())
                    else:
                        reached += 1
    finally:
        sel.close()
        rdzv.close()
        data.close()
    return reached
