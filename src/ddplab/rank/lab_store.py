"""Helpers for lab scripts that meet outside a process group: torchrun's own store (always reachable
under torchrun), ports rank 0 picks and shares through it, a barrier on a store, a heartbeat record,
and a sweep of real init_process_group calls against a rank that arrives late. Imported by lab
scripts only (it imports torch)."""
from __future__ import annotations

import datetime
import os
import socket
import threading
import time

import torch.distributed as dist

from ddplab.rank import lab


def agent_store() -> dist.TCPStore:
    """torchrun's own store (always reachable here): used only to share a free port and to pace sweeps."""
    return dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False,
                         timeout=datetime.timedelta(seconds=30))


def shared_ports(rank: int, key: str) -> tuple[int, int]:
    """Two fresh ports: one for a store of the lab's own, one where nothing listens. Rank 0 picks them,
    the others read them from torchrun's store under ``key``."""
    store = agent_store()
    if rank == 0:
        with socket.socket() as s1, socket.socket() as s2:
            s1.bind(("127.0.0.1", 0))
            s2.bind(("127.0.0.1", 0))
            store.set(key, f"{s1.getsockname()[1]},{s2.getsockname()[1]}")
    port, dead = store.get(key).decode().split(",")
    return int(port), int(dead)


def store_barrier(store: dist.TCPStore, key: str, world: int) -> None:
    store.add(key, 1)
    while int(store.add(key, 0)) < world:
        time.sleep(0.01)


def heartbeat(t0: float, every_s: float = 2.0) -> None:
    """Record every ``every_s`` how long the rank has waited since ``t0`` (a daemon thread)."""
    def beat():
        while True:
            time.sleep(every_s)
            lab.record("waiting", seconds=round(time.monotonic() - t0, 3))
    threading.Thread(target=beat, daemon=True).start()


def late_rank_sweep(rank: int, world: int, timeouts, delays) -> None:
    """For many (timeout, delay) pairs in one job: each trial is a real init_process_group on a fresh
    store prefix; rank 1 arrives `delay` seconds after rank 0 starts waiting. Records each trial."""
    store = agent_store()
    pairs = [(t, d) for d in delays for t in timeouts]
    for k, (timeout_s, delay) in enumerate(pairs):
        store_barrier(store, f"sweep/{k}/start", world)
        t0 = time.monotonic()
        outcome, err = "ok", None
        if rank != 0:
            while time.monotonic() - t0 < delay and not store.check([f"sweep/{k}/gave_up"]):
                time.sleep(0.02)
            if store.check([f"sweep/{k}/gave_up"]):
                outcome = "too_late"          # rank 0 had already given up: nothing to join any more
        if outcome == "ok":
            try:
                # Each rank names a new group by a per-process counter; reset it, or a rank that skipped a
                # trial (too late) would look for the other rank's address under another name.
                dist.distributed_c10d._world.group_count = 0
                dist.init_process_group("gloo", store=dist.PrefixStore(f"sweep/{k}", store), rank=rank,
                                        world_size=world, timeout=datetime.timedelta(seconds=timeout_s))
                dist.destroy_process_group()
            except RuntimeError as e:
                outcome, err = "failed", str(e).splitlines()[0][:200]
                store.set(f"sweep/{k}/gave_up", "1")
        lab.record("trial", timeout_s=timeout_s, delay_s=delay, outcome=outcome,
                   seconds=round(time.monotonic() - t0, 3), error=err)
        store_barrier(store, f"sweep/{k}/end", world)


def late(rank: int, late_s: float) -> None:
    """Lab 06: rank 1 starts ``late_s`` seconds late (slow data staging, a busy node, a container still pulling)."""
    if rank == 1:
        lab.record("late_start", late_s=late_s)
        time.sleep(late_s)
