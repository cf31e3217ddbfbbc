"""Lab 09 - the network, for real: a two-node DDP job on one machine (network namespaces).

Each node is a network namespace with its own address on a bridge (``ddplab.origins.cluster``); torchrun
runs one agent per node with c10d rendezvous at node 0's address. Run it on two real machines:

    torchrun --nnodes 2 --nproc-per-node 1 --rdzv-backend c10d --rdzv-endpoint NODE0:29400 \
        labs/09_network.py --variant slow-link            # on each machine
    ddplab run 09 --variant firewall      # the same on one machine: 2 nodes made, judged, removed

Notebook: notebooks/09_network.ipynb; workbook module: ddplab.course.lab09. The network of each
variant (link cap, firewall, hosts file) is LAB["network"]: ddplab builds it around the run; this
script is only the training job, the same on every variant except its gradient hook.

Variants:
  slow-link        DDP on a 100 Mbit/s link: the gradient all-reduce no longer hides behind backward.
  fixed-compress   the same link with the fp16 compression hook (--hook powersgd: PowerSGD, rank 2).
  firewall         the nodes accept the rendezvous port but drop new connections to gloo's data ports
                   (the ephemeral range): the ranks stall connecting in init_process_group.
  fixed-firewall   the nodes also accept everything from the cluster's own subnet.
  wrong-interface  each node's hostname resolves to 127.0.1.1 (Debian's /etc/hosts line): gloo binds
                   loopback and tells its peer to dial 127.0.1.1, which is the peer's own loopback.
  fixed-interface  the same hosts files, GLOO_SOCKET_IFNAME=eth0.
  lossy-link       node 1 drops 5% of the packets it receives: TCP retransmits, the job is slower.
  nodes-disagree   node 0 starts 1 rank, node 1 starts 2, with TORCH_ELASTIC_WORKER_IDENTICAL=1: each node's
                   torchrun computes WORLD_SIZE itself (2 and 4) and init_process_group waits for ranks that
                   never come. On two machines: torchrun --nnodes 2 --nproc-per-node 1 (node 0) / 2 (node 1) ...
  fixed-world-size the same uneven launch without it: torchrun adds up the nodes' ranks in its store (3).
"""
import statistics
import time

import torch
import torch.nn as nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as powersgd
from torch.nn.parallel import DistributedDataParallel as DDP

from ddplab.rank import lab

LAB = {
    "title": "The network, for real: two nodes on one machine",
    "article": "000_5eac2459042e419e.txt",
    "nproc": 1,
    "min_nproc": 1,
    "variants": {
        "slow-link": {"expect": "ok", "signature": None,
                      "about": "DDP over a 100 Mbit/s link: the all-reduce dominates the step"},
        "fixed-compress": {"expect": "ok", "signature": None,
                           "about": "the same link with the fp16 compression hook (or --hook powersgd)"},
        "firewall": {"expect": "hung", "signature": "hang-data-port-blocked",
                     "about": "rendezvous port open, gloo's data ports dropped on both nodes: stalls connecting in init"},
        "fixed-firewall": {"expect": "ok", "signature": None,
                           "about": "the nodes accept everything from the cluster's subnet"},
        "wrong-interface": {"expect": "failed", "signature": "gloo-loopback-address",
                            "about": "hostnames resolve to 127.0.1.1: gloo advertises loopback, the peer dials its own loopback and gloo times out"},
        "fixed-interface": {"expect": "ok", "signature": None,
                            "about": "the same hosts files with GLOO_SOCKET_IFNAME=eth0"},
        # "measured": its verdict compares the step times of two runs, so make workbook runs it alone
        "lossy-link": {"expect": "ok", "signature": None, "measured": "step times with and without loss",
                       "about": "node 1 drops 5% of its incoming packets: slower, no stall"},
        "nodes-disagree": {"expect": "hung", "signature": "hang-rendezvous",
                           "about": "1 rank on node 0, 2 on node 1, TORCH_ELASTIC_WORKER_IDENTICAL=1: WORLD_SIZE 2 and 4"},
        "fixed-world-size": {"expect": "ok", "signature": None,
                             "about": "the same uneven nodes, torchrun's default rank assignment: WORLD_SIZE 3 on all"},
    },
    # The network ddplab builds around each variant (ddplab.origins.cluster.Cluster.from_spec).
    "network": {
        "slow-link": {"nodes": 2, "rate_mbit": 100},
        "fixed-compress": {"nodes": 2, "rate_mbit": 100},
        "firewall": {"nodes": 2, "firewall": {"0": {"allow_ports": [29400], "block_ports": [1024, 65535]}}},
        "fixed-firewall": {"nodes": 2, "firewall": {"0": {"allow_ports": [29400], "allow_from": "cluster",
                                                          "block_ports": [1024, 65535]}}},
        "wrong-interface": {"nodes": 2, "self_hosts": "127.0.1.1"},
        "fixed-interface": {"nodes": 2, "self_hosts": "127.0.1.1", "env": {"GLOO_SOCKET_IFNAME": "eth0"}},
        "lossy-link": {"nodes": 2, "firewall": {"1": {"drop_percent": 5}}},
        # "nproc": a node's own --nproc-per-node; the environment is every node's agent's (and ranks')
        "nodes-disagree": {"nodes": 2, "nproc": {"1": 2}, "env": {"TORCH_ELASTIC_WORKER_IDENTICAL": "1"}},  # BROKEN
        "fixed-world-size": {"nodes": 2, "nproc": {"1": 2}},                              # FIX: torchrun counts
    },
}

HOOKS = {"none": (default_hooks.allreduce_hook, 4), "fp16": (default_hooks.fp16_compress_hook, 2),
         "bf16": (default_hooks.bf16_compress_hook, 2), "powersgd": (None, None)}
WIDTH, DEPTH, BATCH = 512, 4, 64      # ~1.05 M parameters: 4.2 MB of fp32 gradients a step


def build_model() -> nn.Module:
    torch.manual_seed(0)
    layers = []
    for _ in range(DEPTH):
        layers += [nn.Linear(WIDTH, WIDTH), nn.ReLU()]
    return nn.Sequential(*layers[:-1])


def plain(model: DDP):
    return "none"                                         # BROKEN on a slow link: 4 bytes a gradient on the wire


def compressed(model: DDP, hook: str = "fp16"):
    if hook == "powersgd":                                # FIX: a rank-2 approximation of each gradient matrix
        state = powersgd.PowerSGDState(process_group=None, matrix_approximation_rank=2, start_powerSGD_iter=2)
        model.register_comm_hook(state, powersgd.powerSGD_hook)
        return hook
    fn, _ = HOOKS[hook]

    def wire(state, bucket, fn=fn):                       # FIX: 2 bytes a gradient (gloo all-reduces fp16/bf16)
        return fn(state, bucket)
    wire.__name__ = "wire_" + fn.__name__                 # DDP refuses a hook *named* bf16_compress_hook without NCCL
    model.register_comm_hook(None, wire)
    return hook


VARIANTS = {"slow-link": plain, "fixed-compress": compressed, "firewall": plain, "fixed-firewall": plain,
            "wrong-interface": plain, "fixed-interface": plain, "lossy-link": plain, "nodes-disagree": plain,
            "fixed-world-size": plain}


def main(variant: str, steps: int = 8, hook: str = "fp16", compare: tuple = ()) -> None:
    t0 = time.perf_counter()
    ctx = lab.setup()                                     # init_process_group: gloo connects to every peer here
    lab.record("joined", init_s=time.perf_counter() - t0)
    models = {}
    first = hook if VARIANTS[variant] is compressed else "none"      # this variant's own model first
    for h in dict.fromkeys([first, *compare]):
        # PowerSGD issues its all-reduces from futures' callbacks; with two buckets (DDP's default first
        # bucket is 1 MB) the ranks issued them in different orders and gloo aborted ("Received data size
        # doesn't match expected size", measured). One bucket keeps the order the same on every rank.
        model = DDP(build_model(), bucket_cap_mb=16 if h == "powersgd" else None)
        used = compressed(model, h) if h != "none" else plain(model)
        models[used] = (model, torch.optim.SGD(model.parameters(), lr=0.01))
    g = torch.Generator().manual_seed(ctx.rank)
    x, y = torch.randn(BATCH, WIDTH, generator=g), torch.randn(BATCH, WIDTH, generator=g)
    step_s, compute_s = {h: [] for h in models}, []
    for i in range(steps + 2):                            # 2 warm-up steps (PowerSGD starts at step 2)
        for h, (model, opt) in models.items():            # --compare: each hook's step in turn, same link, same load
            with lab.StepTimer() as t:
                opt.zero_grad()
                nn.functional.mse_loss(model(x), y).backward()
                opt.step()
            if i >= 2:
                step_s[h].append(t.seconds)
    model = next(iter(models.values()))[0]
    with model.no_sync():                                 # the same step without communication: compute only
        for _ in range(max(3, steps)):
            with lab.StepTimer() as t:
                nn.functional.mse_loss(model(x), y).backward()
            compute_s.append(t.seconds)
    params = sum(p.numel() for p in model.parameters())
    for h, times in step_s.items():
        # The fastest step is the one least disturbed by other work on a shared machine; the median too.
        lab.record("steps", hook=h, steps=steps, step_ms=statistics.median(times) * 1e3, best_ms=min(times) * 1e3,
                   compute_ms=min(compute_s) * 1e3, grad_mb=params * 4 / 2**20,
                   all_ms=[round(s * 1e3, 3) for s in times])    # every timed step: what packet loss delays
    lab.record("done")
    lab.teardown()


if __name__ == "__main__":
    import argparse

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--variant", choices=list(LAB["variants"]), default="slow-link",
                   help="which version of the job to run (its network is built by ddplab)")
    p.add_argument("--steps", type=int, choices=range(1, 201), metavar="1..200", default=8,
                   help="timed training steps")
    p.add_argument("--hook", choices=list(HOOKS), default="fp16",
                   help="fixed-compress: the gradient compression hook")
    p.add_argument("--compare", default="", metavar="HOOK,...",
                   help="also time these hooks in the same job, each on its own copy of the model, their steps "
                        f"in turn (the workbook's rate sweep): any of {', '.join(HOOKS)}")
    a = p.parse_args()
    compare = tuple(h for h in a.compare.split(",") if h)
    if bad := [h for h in compare if h not in HOOKS]:
        p.error(f"--compare {a.compare}: {', '.join(bad)} is not a hook ({', '.join(HOOKS)})")
    main(a.variant, a.steps, a.hook, compare)
