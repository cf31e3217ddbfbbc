"""N nodes on one machine: network namespaces on a bridge, for real multi-node torchrun.

    with Cluster(nodes=2, rate_mbit=100) as c:
        ddplab.run("09", variant="slow-link", cluster=c)

Each node is a network namespace (``ddplab-<id>-n<k>``) with one veth link (``eth0`` inside, its
peer ``ddplab<id>h<k>`` on the bridge ``ddplab<id>br`` outside), its own address (10.213.0.k+1/24),
loopback up, its own hosts file (``ip netns exec`` bind-mounts /etc/netns/<name>/hosts), its own
hostname (a UTS namespace per agent: ``node<k>``), and optionally a bandwidth cap on its link (a tbf
qdisc on eth0: traffic it sends) and firewall rules (an nftables table inside the namespace: drop
new connections to a port range, drop a share of packets with ``numgen random mod 100 < P``).
The bridge has no address: the host's own network never sees the nodes' traffic.

Every kernel object is named with the ``ddplab`` prefix and the run id; the qdiscs and nft tables
live inside the namespaces and go with them. An owner file (/run/ddplab-cluster/<id>.json: the pid
and its start time) is written before anything is created, so the next Cluster (or ``cleanup()``)
removes the objects of any run whose owner is gone (a SIGKILLed notebook kernel) and never those of
a run still alive. The context manager tears down on exit, on an exception, on Ctrl-C and on SIGTERM.

Running it: python -m ddplab.origins.cluster agents SPEC.json is the job's parent process when ddplab.run
is given a cluster: it starts one torchrun agent per node (``ip netns exec <ns> unshare --uts``),
waits for them, merges their outcomes into torchrun.json and exits with the first failure's code.
"""
from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Iterator

import psutil

from ddplab import runfiles
from ddplab.defaults import AGENT_GRACE_S
from ddplab.errors import DdplabError
from ddplab.origins import envutil
from ddplab.tools.system import PARTS, Need, missing

PREFIX = "ddplab"
OWNER_DIR = Path("/run/ddplab-cluster")
NETNS_ETC = Path("/etc/netns")
SUBNET = ipaddress.ip_network("10.213.0.0/24")
DEFAULT_NAME = "node"
TBF_BURST = "64kb"
TBF_LATENCY = "50ms"


def _sh(*cmd: str, check: bool = True, input: str | None = None) -> subprocess.CompletedProcess:
    p = subprocess.run(cmd, capture_output=True, text=True, input=input)
    if check and p.returncode != 0:
        raise DdplabError(f"`{' '.join(cmd)}` failed: {(p.stderr or p.stdout).strip()[:200]}",
                          hint="run `ddplab doctor` to see what this machine allows")
    return p


def requirement() -> Need | None:
    """None when clusters can be made here; else what is missing (data: ``str`` of it is the line)."""
    if sys.platform != "linux":
        return Need("Linux network namespaces (ip netns)", f"this is {sys.platform}: run lab 09 on Linux")
    tools = missing(PARTS["labs"][1])
    if tools:
        return tools[0]
    if os.geteuid() != 0:
        return Need("root to create network namespaces",
                    "run as root (sudo), or in a container run with --cap-add NET_ADMIN --cap-add SYS_ADMIN")
    return None


def require() -> None:
    why = requirement()
    if why:
        raise DdplabError(f"lab 09 {why}", hint="lab 09's notebook keeps its stored outputs; the other labs need none of this")


# ----------------------------------------------------------------------------------------------
# Owned objects: found by prefix, removed when their owner is gone
# ----------------------------------------------------------------------------------------------

def _own(run_id: str) -> None:
    """Write the owner file of ``run_id`` (this process and its start time) before any object of it
    exists, so that a later run can tell a killed owner's objects from a live one's."""
    OWNER_DIR.mkdir(parents=True, exist_ok=True)
    me = psutil.Process()
    (OWNER_DIR / f"{run_id}.json").write_text(json.dumps({"pid": me.pid, "created": me.create_time()}))


def _owner_pid(run_id: str) -> int | None:
    try:
        return int(json.loads((OWNER_DIR / f"{run_id}.json").read_text())["pid"])
    except (OSError, ValueError, KeyError):
        return None


def namespaces_owned_by(pid: int | None) -> list[str]:
    """ddplab's namespaces on this machine whose owner is process ``pid`` (None: any owner)."""
    return [ns for ns in owned_objects()["netns"]
            if pid is None or ((rid := _run_id(ns)) is not None and _owner_pid(rid) == pid)]


def _owner_alive(run_id: str) -> bool:
    try:
        d = json.loads((OWNER_DIR / f"{run_id}.json").read_text())
        p = psutil.Process(int(d["pid"]))
        return abs(p.create_time() - float(d["created"])) < 1.0 and p.status() != psutil.STATUS_ZOMBIE
    except (OSError, ValueError, KeyError, psutil.Error):
        return False


_NS = re.compile(rf"^{PREFIX}-([0-9a-f]{{4}})-n\d+$")
_LINK = re.compile(rf"^{PREFIX}([0-9a-f]{{4}})(br|h\d+)$")


def owned_objects() -> dict[str, list[str]]:
    """Every kernel object and file of ddplab's clusters on this machine, by kind."""
    out: dict[str, list[str]] = {"netns": [], "link": [], "etc": [], "owner": [], "nft": []}
    p = _sh("ip", "netns", "list", check=False)
    out["netns"] = [ln.split()[0] for ln in p.stdout.splitlines() if ln.split() and _NS.match(ln.split()[0])]
    p = _sh("ip", "-o", "link", "show", check=False)
    for ln in p.stdout.splitlines():
        parts = ln.split(":")
        if len(parts) > 1:
            name = parts[1].strip().split("@")[0]
            if _LINK.match(name):
                out["link"].append(name)
    if NETNS_ETC.is_dir():
        out["etc"] = [d.name for d in NETNS_ETC.iterdir() if _NS.match(d.name)]
    if OWNER_DIR.is_dir():
        out["owner"] = [f.stem for f in OWNER_DIR.glob("*.json")]
    if shutil.which("nft"):
        p = _sh("nft", "list", "tables", check=False)
        out["nft"] = [ln.split()[-1] for ln in p.stdout.splitlines() if ln.split() and ln.split()[-1].startswith(PREFIX)]
    return out


def _run_id(name: str) -> str | None:
    m = _NS.match(name) or _LINK.match(name)
    if m:
        return m.group(1)
    m = re.match(rf"^{PREFIX}([0-9a-f]{{4}})", name)
    return m.group(1) if m else (name if re.fullmatch(r"[0-9a-f]{4}", name) else None)


def leftovers() -> dict[str, list[str]]:
    """ddplab's objects whose owner is gone (what a killed run left; the next Cluster removes them).
    Another process's live cluster is not a leftover."""
    out = {}
    for kind, names in owned_objects().items():
        if kind == "owner":
            continue
        dead = [n for n in names if (rid := _run_id(n)) is not None and not _owner_alive(rid)]
        if dead:
            out[kind] = dead
    return out


def cleanup(include_live: bool = False) -> list[str]:
    """Remove what clusters of dead owners left (all of ddplab's with ``include_live``). Returns what
    was removed, as ``kind:name``."""
    removed = []
    objs = owned_objects()
    def dead(name: str) -> bool:
        rid = _run_id(name)
        return rid is not None and (include_live or not _owner_alive(rid))
    for ns in objs["netns"]:
        if dead(ns):
            _sh("ip", "netns", "delete", ns, check=False)     # its veth end, qdiscs and nft tables go with it
            removed.append(f"netns:{ns}")
    for link in objs["link"]:
        if dead(link) and _sh("ip", "link", "delete", link, check=False).returncode == 0:
            removed.append(f"link:{link}")
    for table in objs["nft"]:
        if dead(table):
            _sh("nft", "delete", "table", "inet", table, check=False)
            removed.append(f"nft:{table}")
    for d in objs["etc"]:
        if dead(d):
            shutil.rmtree(NETNS_ETC / d, ignore_errors=True)
            removed.append(f"etc:{d}")
    for rid in objs["owner"]:
        if include_live or not _owner_alive(rid):
            (OWNER_DIR / f"{rid}.json").unlink(missing_ok=True)
    return removed


# ----------------------------------------------------------------------------------------------
# The cluster
# ----------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Firewall:
    """nftables rules inside one node's namespace (its INPUT: what reaches its sockets).

    ``block_ports``: drop NEW TCP connections to this range (replies to the node's own connections
    and connections to other ports pass). ``allow_from``: accept anything from this subnet first
    (the fix: trust the cluster's own network). ``drop_percent``: drop that share of all packets.
    """
    block_ports: tuple[int, int] | None = None
    allow_ports: tuple[int, ...] = ()
    allow_from: str | None = None
    drop_percent: int = 0

    def ruleset(self, table: str) -> str:
        rules = ["ct state established,related accept"] if self.block_ports else []
        if self.allow_from:
            rules.append(f"ip saddr {self.allow_from} accept")
        for port in self.allow_ports:
            rules.append(f"tcp dport {port} accept")
        if self.block_ports:
            lo, hi = self.block_ports
            rules.append(f"iifname != \"lo\" tcp dport {lo}-{hi} ct state new drop")
        if self.drop_percent:
            rules.insert(0, f"iifname != \"lo\" numgen random mod 100 < {int(self.drop_percent)} drop")
        body = "\n    ".join(rules)
        return (f"table inet {table} {{\n  chain input {{\n    type filter hook input priority 0; policy accept;\n"
                f"    {body}\n  }}\n}}\n")


@dataclass(frozen=True)
class Node:
    index: int
    netns: str
    address: str
    hostname: str
    host_link: str
    rate_mbit: float | None
    firewall: Firewall | None
    hosts: str

    def exec_prefix(self) -> list[str]:
        """Run a command on this node: in its namespace, with its hostname (a UTS namespace)."""
        return ["ip", "netns", "exec", self.netns, "unshare", "--uts", "sh", "-c",
                f'hostname {self.hostname} && exec "$@"', "node"]


@dataclass
class Cluster:
    """N nodes on a bridge; a context manager (nothing of it is left after the ``with``).

    ``rate_mbit``: a tbf cap on every node's link (None: none). ``firewall``: {node index: Firewall}.
    ``self_hosts``: what each node's own hostname resolves to in its hosts file: "address" (its eth0
    address, like a well set up cluster) or "127.0.1.1" (Debian's default /etc/hosts line).
    ``nproc``: {node index: its own --nproc-per-node} where a node is launched unlike the others.
    """
    nodes: int = 2
    rate_mbit: float | None = None
    firewall: dict = field(default_factory=dict)
    self_hosts: str = "address"
    nproc: dict = field(default_factory=dict)
    run_id: str = field(default_factory=lambda: secrets.token_hex(2))
    members: list[Node] = field(default_factory=list, init=False)
    active: bool = field(default=False, init=False)
    _old_term: object = field(default=None, init=False, repr=False)

    @classmethod
    def from_spec(cls, spec: dict) -> "Cluster":
        """From a lab's ``network`` entry: nodes, rate_mbit, self_hosts, firewall {node or "all": Firewall
        fields} ("allow_from": "cluster" is the cluster's own subnet)."""
        spec = dict(spec)
        if "all" in (spec.get("firewall") or {}):
            spec["firewall"] = {str(i): spec["firewall"]["all"] for i in range(int(spec.get("nodes", 2)))}
        fw = {int(k): Firewall(block_ports=tuple(v["block_ports"]) if v.get("block_ports") else None,
                               allow_ports=tuple(v.get("allow_ports", ())),
                               allow_from=str(SUBNET) if v.get("allow_from") == "cluster" else v.get("allow_from"),
                               drop_percent=int(v.get("drop_percent", 0)))
              for k, v in (spec.get("firewall") or {}).items()}
        return cls(nodes=int(spec.get("nodes", 2)), rate_mbit=spec.get("rate_mbit"), firewall=fw,
                   self_hosts=spec.get("self_hosts", "address"),
                   nproc={int(k): int(v) for k, v in (spec.get("nproc") or {}).items()})

    def nproc_of(self, index: int, default: int) -> int:
        """The --nproc-per-node node ``index`` is launched with (``default``: the job's)."""
        return self.nproc.get(index, default)

    def ranks(self, default: int) -> int:
        """How many rank processes the nodes start together (``default`` per node unless told)."""
        return sum(self.nproc_of(i, default) for i in range(self.nodes))

    @property
    def bridge(self) -> str:
        return f"{PREFIX}{self.run_id}br"

    @property
    def master(self) -> Node:
        return self.members[0]

    def describe(self) -> dict:
        """The cluster as data (for a run's record)."""
        return {"run_id": self.run_id, "nodes": [
            {"index": n.index, "netns": n.netns, "address": n.address, "hostname": n.hostname,
             "rate_mbit": n.rate_mbit, "firewall": n.firewall.ruleset(f"{PREFIX}{self.run_id}") if n.firewall else None,
             "hosts": n.hosts, "nproc": self.nproc.get(n.index)} for n in self.members]}

    def __enter__(self) -> "Cluster":
        require()
        if not 1 <= self.nodes <= 200:
            raise DdplabError(f"a cluster of {self.nodes} nodes is not possible here", hint="use 2 to 8 nodes")
        cleanup()
        _own(self.run_id)
        if threading_main():
            self._old_term = signal.signal(signal.SIGTERM, _term_to_interrupt)
        try:
            self._create()
        except BaseException:
            self.close()
            raise
        self.active = True
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _create(self) -> None:
        hosts_ip = [str(SUBNET.network_address + i + 1) for i in range(self.nodes)]
        names = [f"{DEFAULT_NAME}{i}" for i in range(self.nodes)]
        _sh("ip", "link", "add", self.bridge, "type", "bridge")
        _sh("ip", "link", "set", self.bridge, "up")
        for i in range(self.nodes):
            ns, host_link = f"{PREFIX}-{self.run_id}-n{i}", f"{PREFIX}{self.run_id}h{i}"
            lines = ["127.0.0.1 localhost"]
            for j in range(self.nodes):
                addr = "127.0.1.1" if (j == i and self.self_hosts == "127.0.1.1") else hosts_ip[j]
                lines.append(f"{addr} {names[j]}")
            hosts = "\n".join(lines) + "\n"
            (NETNS_ETC / ns).mkdir(parents=True, exist_ok=True)
            (NETNS_ETC / ns / "hosts").write_text(hosts)
            _sh("ip", "netns", "add", ns)
            _sh("ip", "link", "add", host_link, "type", "veth", "peer", "name", "eth0", "netns", ns)
            _sh("ip", "link", "set", host_link, "master", self.bridge)
            _sh("ip", "link", "set", host_link, "up")
            _sh("ip", "-n", ns, "addr", "add", f"{hosts_ip[i]}/{SUBNET.prefixlen}", "dev", "eth0")
            _sh("ip", "-n", ns, "link", "set", "eth0", "up")
            _sh("ip", "-n", ns, "link", "set", "lo", "up")
            if self.rate_mbit:
                _sh("tc", "-n", ns, "qdisc", "add", "dev", "eth0", "root", "tbf", "rate", f"{self.rate_mbit:g}mbit",
                    "burst", TBF_BURST, "latency", TBF_LATENCY)
            fw = self.firewall.get(i)
            if fw is not None:
                _sh("ip", "netns", "exec", ns, "nft", "-f", "-", input=fw.ruleset(f"{PREFIX}{self.run_id}"))
            self.members.append(Node(i, ns, hosts_ip[i], names[i], host_link, self.rate_mbit, fw, hosts))

    def close(self) -> None:
        """Remove every object of this cluster (safe to call twice)."""
        for n in range(self.nodes):
            ns = f"{PREFIX}-{self.run_id}-n{n}"
            _sh("ip", "netns", "delete", ns, check=False)
            _sh("ip", "link", "delete", f"{PREFIX}{self.run_id}h{n}", check=False)
            shutil.rmtree(NETNS_ETC / ns, ignore_errors=True)
        _sh("ip", "link", "delete", self.bridge, check=False)
        (OWNER_DIR / f"{self.run_id}.json").unlink(missing_ok=True)
        self.members.clear()
        self.active = False
        if self._old_term is not None and threading_main():
            signal.signal(signal.SIGTERM, self._old_term)
            self._old_term = None


@dataclass(frozen=True)
class LoopbackNode:
    """One node of ``LoopbackNodes``: a torchrun agent on this machine's loopback, in no namespace."""
    index: int
    address: str = "127.0.0.1"

    @property
    def hostname(self) -> str:
        return f"{DEFAULT_NAME}{self.index}"

    def exec_prefix(self) -> list[str]:
        return []


@dataclass
class LoopbackNodes:
    """N torchrun agents on this machine's loopback (``--nnodes N``, one c10d rendezvous): what a
    multi-node launch changes for the ranks (RANK != LOCAL_RANK, GROUP_RANK, one agent per node)
    without network namespaces, so without root. Nothing is created: a context manager only to be
    used where a ``Cluster`` is. The rendezvous port is chosen free (a ``Cluster`` has addresses of
    its own; loopback is shared with every other job here)."""
    nodes: int = 2
    nproc: dict = field(default_factory=dict)
    members: list = field(default_factory=list, init=False)
    active: bool = field(default=False, init=False)

    def __post_init__(self) -> None:
        self.members = [LoopbackNode(i) for i in range(self.nodes)]

    nproc_of = Cluster.nproc_of
    ranks = Cluster.ranks
    master = Cluster.master

    def describe(self) -> dict:
        return {"run_id": None, "loopback": True, "nodes": [
            {"index": n.index, "netns": None, "address": n.address, "hostname": n.hostname,
             "nproc": self.nproc.get(n.index)} for n in self.members]}

    def __enter__(self) -> "LoopbackNodes":
        self.active = True
        return self

    def __exit__(self, *exc) -> None:
        self.active = False


def threading_main() -> bool:
    import threading
    return threading.current_thread() is threading.main_thread()


def _term_to_interrupt(signum, frame):
    raise KeyboardInterrupt("SIGTERM")


# ----------------------------------------------------------------------------------------------
# One address where nothing answers (lab 06): a namespace of the same family, owned the same way
# ----------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class SilentMaster:
    """Where a job's ranks dial a master that never answers, and how that was made."""
    address: str
    kind: str          # "netns" (packets dropped, like a firewall) or "loopback" (nothing listens: refused)
    namespace: str | None
    note: str

    def to_dict(self) -> dict:
        return asdict(self)


def netns_available() -> tuple[bool, str]:
    """(True, "") when this process can create a network namespace; else (False, why not)."""
    if sys.platform != "linux":
        return False, "network namespaces need Linux"
    if os.geteuid() != 0:
        return False, "creating a network namespace needs root"
    if shutil.which("ip") is None:
        return False, "the `ip` command (iproute2) is not installed"
    r = _sh("ip", "netns", "list", check=False)
    if r.returncode != 0:
        return False, f"`ip netns` does not work here: {r.stderr.strip()[:120]}"
    return True, ""


@contextlib.contextmanager
def silent_master(prefer: str = "netns") -> Iterator[SilentMaster]:
    """A master address that never answers, removed on exit whatever happens (and by the next
    ``cleanup()`` if this process is killed inside the ``with``).

    ``netns`` (root and `ip netns`): a namespace of its own with an address reached over a veth
    pair, and no route back out of it, so every packet sent there is silently dropped, as a
    firewall's DROP rule would. Otherwise (or with prefer="loopback") 127.0.0.1 at a port where
    nothing listens: the connection is refused at once, and PyTorch retries until its timeout.
    """
    if prefer not in ("netns", "loopback"):
        raise DdplabError(f"unknown kind of silent master {prefer!r}", hint="use prefer='netns' or prefer='loopback'")
    ok, why = netns_available() if prefer == "netns" else (False, "loopback asked for")
    if not ok:
        yield SilentMaster("127.0.0.1", "loopback", None,
                           f"loopback, a port where nothing listens (connection refused; {why})")
        return
    cleanup()
    run_id = secrets.token_hex(2)
    ns, host_if, ns_if = f"{PREFIX}-{run_id}-n0", f"{PREFIX}{run_id}h0", "eth0"
    addr = f"10.206.{int(run_id[:2], 16) % 250 + 1}.{int(run_id[2:], 16) % 250 + 2}"
    _own(run_id)
    try:
        _sh("ip", "netns", "add", ns)
        _sh("ip", "link", "add", host_if, "type", "veth", "peer", "name", ns_if, "netns", ns)
        _sh("ip", "-n", ns, "addr", "add", f"{addr}/32", "dev", ns_if)
        _sh("ip", "-n", ns, "link", "set", ns_if, "up")
        _sh("ip", "link", "set", host_if, "up")
        _sh("ip", "route", "add", f"{addr}/32", "dev", host_if)
        mac = _sh("ip", "-n", ns, "-o", "link", "show", ns_if).stdout.split("link/ether ")[1].split()[0]
        # A fixed neighbour entry: the packets really arrive in the namespace, which has no route back
        # to the sender, so no SYN-ACK and no RST ever leaves it.
        _sh("ip", "neigh", "replace", addr, "lladdr", mac, "dev", host_if, "nud", "permanent")
        yield SilentMaster(addr, "netns", ns, f"network namespace {ns} ({addr}): packets dropped, like a firewall")
    finally:
        # Deleting the namespace deletes both ends of the veth pair, and with them the route.
        _sh("ip", "netns", "delete", ns, check=False)
        _sh("ip", "link", "delete", host_if, check=False)
        (OWNER_DIR / f"{run_id}.json").unlink(missing_ok=True)


# ----------------------------------------------------------------------------------------------
# The job's parent: one torchrun agent per node
# ----------------------------------------------------------------------------------------------

def agents_main(spec_path: str) -> int:
    """Start each node's agent, wait for all, merge their outcomes into torchrun.json."""
    spec = json.loads(Path(spec_path).read_text())
    procs = []
    for node in spec["nodes"]:
        log = open(node["log"], "wb")
        # each node's agent ends with this process (SIGTERM from the kernel), as this one ends with the
        # launcher: a killed launcher leaves no node running
        procs.append(subprocess.Popen(envutil.ending_with_this_process(node["command"]), stdout=log,
                                      stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL))
    # Like a cluster scheduler (srun --kill-on-bad-exit), when one node's agent fails the others are
    # ended: torchrun ends the workers of its own node only, so a rank left waiting for a peer that
    # failed on another node would otherwise wait for its 30-minute timeout.
    import time
    # A rank's error record (the rank hook writes it as the exception leaves the script) counts as
    # that node failing: its agent can take seconds to wind down, while a peer on another node waits.
    ranks_dir = Path(spec["ranks_dir"]) if spec.get("ranks_dir") else None
    failed_at, first = None, None
    while any(p.poll() is None for p in procs):
        errored = sorted(p for p in ranks_dir.glob("rank*") if runfiles.rank_of(p.name, runfiles.ERROR) is not None) \
            if ranks_dir is not None and failed_at is None else []
        if failed_at is None and (errored or any(p.returncode not in (None, 0) for p in procs)):
            failed_at = time.monotonic()
            first = next((i for i, p in enumerate(procs) if p.returncode not in (None, 0)), None)
            if first is None and errored:
                first = _node_of(errored[0], spec)
            for p in procs:
                if p.poll() is None:
                    p.send_signal(signal.SIGTERM)
        if failed_at is not None and time.monotonic() - failed_at > AGENT_GRACE_S:
            for p in procs:
                if p.poll() is None:
                    p.kill()
        time.sleep(0.05)
    codes = [p.returncode for p in procs]
    if first is None:
        first = next((i for i, c in enumerate(codes) if c), None)
    first_bad = (codes[first] or 1) if first is not None else 0
    merged = {"returncode": first_bad, "failures": {}, "torchrun_root_cause": None, "nodes": [],
              "first_failed_node": first}
    order = ([first] if first is not None else []) + [i for i in range(len(procs)) if i != first]
    for node, code in ((spec["nodes"][i], codes[i]) for i in order):
        try:
            d = json.loads(Path(node["result"]).read_text())
        except (OSError, ValueError):
            d = {"returncode": code or 1, "failures": {}, "torchrun_root_cause": None}
        merged["nodes"].append({"node": node["index"], "returncode": code, **d})
        merged["failures"].update(d.get("failures") or {})
        if code and not merged["returncode"]:
            merged["returncode"] = code
        if merged["torchrun_root_cause"] is None and d.get("torchrun_root_cause") is not None:
            merged["torchrun_root_cause"] = d["torchrun_root_cause"]
    if any(codes) and not merged["returncode"]:
        merged["returncode"] = 1
    tmp = Path(spec["result"] + ".tmp")
    tmp.write_text(json.dumps(merged, indent=2))
    os.replace(tmp, spec["result"])
    return first_bad


def _node_of(error_file: Path, spec: dict) -> int | None:
    """The node whose agent started the rank of an error record (torchrun numbers the ranks node by
    node: the first node's nproc, then the next's)."""
    try:
        rank = int(json.loads(error_file.read_text())["rank"])
    except (OSError, ValueError, KeyError):
        return None
    per = int(spec.get("nproc_per_node", 1))
    first = 0
    for i, node in enumerate(spec["nodes"]):
        first += int(node.get("nproc", per))
        if rank < first:
            return i
    return None


def main(argv: list[str]) -> int:
    if argv[:1] == ["agents"] and len(argv) == 2:
        return agents_main(argv[1])
    if argv[:1] == ["cleanup"]:
        for what in cleanup(include_live="--all" in argv):
            print("removed", what)
        return 0
    if argv[:1] == ["list"]:
        print(json.dumps(owned_objects(), indent=2))
        return 0
    print("usage: python -m ddplab.origins.cluster {list | cleanup [--all] | agents SPEC.json}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
