"""Do a job's ranks agree on what they were launched with? Found out before init_process_group.

When two nodes' torchrun agents give their workers different WORLD_SIZE, init_process_group cannot
tell anyone: each rank waits for the number of peers it was told of (lab 09's nodes-disagree: node 0
waits for 2 ranks, node 1's for 4, and nobody is rank 1), for PyTorch's 30-minute timeout. A check
that itself calls init_process_group first (or all_gathers) waits with them. So each rank here

1. records what it was launched with (``Launched``: RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, its node,
   torch, Python, NCCL where there is one, host, pid) before anything else;
2. writes it to the store torchrun already gives its workers (MASTER_ADDR:MASTER_PORT, under the
   key prefix ``PREFIX``), taking a place in arrival order (an ``add``, so two processes given one
   rank number do not overwrite each other), and reads the others' (``exchange``);
3. stops when as many ranks as every WORLD_SIZE it saw have arrived and all agree, or ``settle_s``
   after the last arrival once it saw a disagreement, or at ``wait_s``: a bounded wait, never a hang.

``compare(records)`` (pure, no torch) turns any set of records into ``Disagreement``s: data, each
with its sides grouped by node (the odd side first) and its fix; ``sentence()`` is their view.
``from_run(result)`` reads them back from a pre-flight run's records (``ddplab.tools.preflight``).
Only one torch build exists on this machine, so version disagreement is tested on records.
"""
from __future__ import annotations

import json
import os
import platform
import socket
import time
from collections import Counter
from dataclasses import asdict, dataclass, fields
from typing import Iterable, Mapping

from ddplab.spans import label, span

PREFIX = "ddplab/preflight/"
# compared on every rank: the field, how a person calls it, what to do when ranks differ
COMPARED = {
    "world_size": ("WORLD_SIZE", None),        # its fix depends on how it came about (``_world_size_fix``)
    "torch": ("torch", "install one torch build on every node (the same wheel: compare "
                       "`python -c 'import torch; print(torch.__version__)'` on each) and launch them from it"),
    "python": ("Python", "use one Python version on every node (the same environment image or conda env)"),
    "nccl": ("NCCL", "use one NCCL on every node (it comes with the torch wheel unless NCCL_* or LD_LIBRARY_PATH "
                     "points elsewhere)"),
}
IDENTICAL_ENV = "TORCH_ELASTIC_WORKER_IDENTICAL"


@dataclass(frozen=True)
class Launched:
    """What one rank was launched with, as its own process sees it."""
    rank: int
    world_size: int            # WORLD_SIZE torchrun gave it
    local_world_size: int      # LOCAL_WORLD_SIZE: the ranks its node started
    node: int | None           # GROUP_RANK: its node's number in torchrun's rendezvous
    torch: str
    python: str
    nccl: str | None           # None without CUDA (gloo is built into torch and has no version of its own)
    host: str
    pid: int
    identical: bool            # TORCH_ELASTIC_WORKER_IDENTICAL=1: its node computed WORLD_SIZE alone

    @classmethod
    def here(cls) -> "Launched":
        """This process, from torchrun's environment (imports torch)."""
        import torch

        nccl = None
        if torch.cuda.is_available():
            try:
                nccl = ".".join(map(str, torch.cuda.nccl.version()))
            except (AttributeError, RuntimeError):
                nccl = None
        env = os.environ
        return cls(int(env["RANK"]), int(env["WORLD_SIZE"]), int(env.get("LOCAL_WORLD_SIZE", env["WORLD_SIZE"])),
                   int(env["GROUP_RANK"]) if env.get("GROUP_RANK", "").isdigit() else None,
                   torch.__version__, platform.python_version(), nccl, socket.gethostname(), os.getpid(),
                   env.get(IDENTICAL_ENV) == "1")

    @classmethod
    def from_dict(cls, d: Mapping) -> "Launched":
        return cls(**{f.name: d.get(f.name) for f in fields(cls)})

    def to_dict(self) -> dict:
        return asdict(self)

    @property
    def key(self) -> tuple:
        """One process: its host and pid (rank numbers may repeat or skip when nodes disagree)."""
        return (self.host, self.pid)


@dataclass(frozen=True)
class Side:
    """One value of a compared field and where it was seen."""
    value: object
    nodes: tuple[int, ...]      # GROUP_RANKs (unknown nodes left out)
    ranks: tuple[int, ...]

    def where(self) -> str:
        nodes = f"node {span(self.nodes)}" if len(self.nodes) == 1 else f"nodes {span(self.nodes)}" if self.nodes else ""
        return f"{nodes} ({label(self.ranks)})" if nodes else label(self.ranks)

    def to_dict(self) -> dict:
        return {"value": self.value, "nodes": list(self.nodes), "ranks": list(self.ranks)}


@dataclass(frozen=True)
class Disagreement:
    """The ranks differ on ``field`` (a key of COMPARED), or on which ranks exist (``field="ranks"``:
    ``missing`` numbers below the largest WORLD_SIZE no process had, ``repeated`` ones two had)."""
    field: str
    sides: tuple[Side, ...] = ()
    missing: tuple[int, ...] = ()
    repeated: tuple[int, ...] = ()
    fix: str = ""

    def sentence(self) -> str:
        if self.field == "ranks":
            what = "; ".join(filter(None, [f"no process is {label(self.missing)}" if self.missing else "",
                                           f"two processes are {label(self.repeated)}" if self.repeated else ""]))
            return f"{what}: {self.fix}"
        name = COMPARED[self.field][0]
        return ("ranks disagree on " + name + ": " + "; ".join(f"{s.where()} {name} {s.value}" for s in self.sides)
                + f". Fix: {self.fix}")

    def to_dict(self) -> dict:
        return {"field": self.field, "sides": [s.to_dict() for s in self.sides], "missing": list(self.missing),
                "repeated": list(self.repeated), "fix": self.fix}


def _sides(records: list[Launched], name: str) -> tuple[Side, ...]:
    by: dict[object, list[Launched]] = {}
    for r in records:
        by.setdefault(getattr(r, name), []).append(r)
    sides = [Side(v, tuple(sorted({r.node for r in rs if r.node is not None})), tuple(sorted(r.rank for r in rs)))
             for v, rs in by.items()]
    # the odd side first: the fewest nodes (then ranks), ties by the lowest node or rank
    return tuple(sorted(sides, key=lambda s: (len(s.nodes), len(s.ranks), s.nodes, s.ranks)))


def _world_size_fix(records: list[Launched]) -> str:
    per_node = sorted({r.local_world_size for r in records})
    if any(r.identical for r in records) and len(per_node) > 1:
        return (f"{IDENTICAL_ENV}=1 makes each node's torchrun compute WORLD_SIZE alone, as --nnodes x its own "
                f"--nproc-per-node (here {' and '.join(map(str, per_node))} ranks a node): unset it, and torchrun "
                "adds up every node's ranks through its store; or start the same number of ranks on every node")
    return ("give every node's torchrun the same --nnodes and --nproc-per-node, and let nothing else set WORLD_SIZE "
            "(a launcher script or the job's own environment)")


def compare(records: Iterable[Launched | Mapping]) -> tuple[Disagreement, ...]:
    """What the ranks disagree on, from their records (each process once): every COMPARED field with
    more than one value, then rank numbers missing or repeated below the largest WORLD_SIZE."""
    seen = {r.key: r for r in (x if isinstance(x, Launched) else Launched.from_dict(x) for x in records)}
    recs = sorted(seen.values(), key=lambda r: (r.rank, r.key))
    out = []
    for name, (_, fix) in COMPARED.items():
        if len({getattr(r, name) for r in recs}) > 1:
            out.append(Disagreement(name, _sides(recs, name), fix=fix or _world_size_fix(recs)))
    if recs:
        count = Counter(r.rank for r in recs)
        missing = tuple(i for i in range(max(r.world_size for r in recs)) if i not in count)
        repeated = tuple(sorted(i for i, n in count.items() if n > 1))
        if missing or repeated:
            fix = ("a node started fewer or more ranks than WORLD_SIZE counts, or one did not start: see "
                   + ("the WORLD_SIZE disagreement" if len({r.world_size for r in recs}) > 1
                      else "whether every node's torchrun ran (and in time)"))
            out.append(Disagreement("ranks", missing=missing, repeated=repeated, fix=fix))
    return tuple(out)


# ----------------------------------------------------------------------------------------------
# Rank side: the exchange through torchrun's store (imports torch)
# ----------------------------------------------------------------------------------------------

def exchange(store, me: Launched, wait_s: float = 10.0, settle_s: float = 1.0,
             poll_s: float = 0.05) -> tuple[tuple[Launched, ...], float, bool]:
    """Write ``me`` to ``store`` (a torch.distributed Store: torchrun's, under PREFIX) and read the
    others' until every WORLD_SIZE seen is reached with all agreeing, ``settle_s`` after the last new
    arrival once any disagreement is seen, or ``wait_s``. Returns (records in arrival order, the
    seconds waited, whether every rank any WORLD_SIZE counts arrived)."""
    t0 = time.monotonic()
    mine = store.add(PREFIX + "arrived", 1) - 1
    store.set(f"{PREFIX}rec/{mine}", json.dumps(me.to_dict()))
    got: dict[int, Launched] = {mine: me}
    last_new = t0
    while True:
        now = time.monotonic()
        arrived = int(store.add(PREFIX + "arrived", 0))
        ready = [i for i in range(arrived) if i not in got and store.check([f"{PREFIX}rec/{i}"])]
        for i in ready:
            got[i] = Launched.from_dict(json.loads(store.get(f"{PREFIX}rec/{i}")))
        if ready:
            last_new = now
        recs = list(got.values())
        complete, differ = len(recs) >= max(r.world_size for r in recs), bool(compare(recs))
        if (complete and not differ) or (differ and now - last_new >= settle_s) or now - t0 >= wait_s:
            break
        time.sleep(poll_s)
    return tuple(got[i] for i in sorted(got)), round(time.monotonic() - t0, 3), complete


def torchrun_store(timeout_s: float):
    """A client of the store torchrun gives its workers (MASTER_ADDR:MASTER_PORT): it exists before,
    and without, any process group."""
    import datetime

    import torch.distributed as dist

    return dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False,
                         timeout=datetime.timedelta(seconds=timeout_s))


# ----------------------------------------------------------------------------------------------
# Launcher side: a pre-flight run's records read back
# ----------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Agreement:
    """What a pre-flight run's ranks recorded: each process once (its own record, and those it saw
    of the others: on a real cluster this node's run folder holds only its own ranks' records)."""
    ranks: tuple[Launched, ...]
    disagreements: tuple[Disagreement, ...]
    waited_s: float | None       # the longest any rank waited for the others
    complete: bool               # every rank that some WORLD_SIZE counts arrived (as one rank at least saw)

    @property
    def ok(self) -> bool:
        return not self.disagreements and self.complete

    def problems(self) -> list[str]:
        return [d.sentence() for d in self.disagreements]

    def to_dict(self) -> dict:
        return {"ranks": [r.to_dict() for r in self.ranks], "disagreements": [d.to_dict() for d in self.disagreements],
                "waited_s": self.waited_s, "complete": self.complete, "ok": self.ok}


def from_records(own: Iterable[Mapping], peers: Iterable[Mapping]) -> Agreement:
    """From the ranks' "preflight" records (own) and "preflight-peers" records (what each saw)."""
    peers = list(peers)
    every = [Launched.from_dict(r) for r in own] + [Launched.from_dict(s) for p in peers for s in p["seen"]]
    ranks = tuple(sorted({r.key: r for r in every}.values(), key=lambda r: (r.rank, r.key)))
    found = compare(ranks)
    return Agreement(ranks, found, max((p["waited_s"] for p in peers), default=None),
                     any(p["complete"] for p in peers) and not any(d.field == "ranks" for d in found))


def from_run(result) -> Agreement:
    """A ``ddplab.run`` of ``ddplab.tools.preflight``'s rank side, read from its records."""
    return from_records(result.records_of("preflight"), result.records_of("preflight-peers"))
