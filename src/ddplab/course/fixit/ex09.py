"""Fix-it 09 (lab 09, the network): an interface name copied from the cluster's job script.

Lab 09 builds two nodes whose hostnames resolve to 127.0.1.1, so gloo picks loopback, and fixes it
with GLOO_SOCKET_IFNAME. Here the script already sets GLOO_SOCKET_IFNAME, to the cluster's
InfiniBand interface, and runs on a machine that has no interface of that name: every rank fails in
init_process_group, where gloo looks for the interface's address ("Unable to find address for: ib0").
"""
from __future__ import annotations

import ast
import ipaddress

from ddplab.course.fixit.exercise import Attempt, Edit, Exercise, Mismatch, WrongFix, has_keyword, params_match

STEPS = 4
BATCH = 16
LR = 0.1
TOL = 1e-5

BROKEN = '''\
# Fix it (lab 09): this training job came with the cluster's job script, which sets the network gloo
# must use; here torchrun starts it on 2 ranks on this machine. It fails at once. Repair it so that it
# trains: every rank ends with the model one process gets from every rank's batches.
import os

import torch
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

from ddplab.rank import lab

os.environ["GLOO_SOCKET_IFNAME"] = "ib0"                  # from the cluster's job script: the fast network
d = lab.setup()
torch.manual_seed(0)
model = DDP(nn.Linear(6, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.1)

for step in range(4):
    g = torch.Generator().manual_seed(50 + 10 * step + d.rank)   # each rank its own batch
    x = torch.randn(16, 6, generator=g)
    loss = nn.functional.mse_loss(model(x), x[:, :1] - 2 * x[:, 1:2])
    opt.zero_grad()
    loss.backward()
    opt.step()

lab.record("final", params=[p.detach().flatten().tolist() for p in model.parameters()])
lab.teardown()
'''

_IFNAME = ('os.environ["GLOO_SOCKET_IFNAME"] = "ib0"                  '
           "# from the cluster's job script: the fast network\n")

REFERENCE = BROKEN.replace(_IFNAME, '''\
# FIX: an interface THIS machine has, on the network its ranks share: here every rank is on this machine,
# so loopback (on a cluster, `ip -4 route get <MASTER_ADDR>` names the interface that reaches rank 0)
os.environ["GLOO_SOCKET_IFNAME"] = "lo"
''')


def baseline(nproc: int) -> list[float]:
    """One process, each step's batch being every rank's batch of that step (equal sizes: DDP's mean)."""
    import torch
    import torch.nn as nn
    torch.manual_seed(0)
    model = nn.Linear(6, 1)
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    for step in range(STEPS):
        x = torch.cat([torch.randn(BATCH, 6, generator=torch.Generator().manual_seed(50 + 10 * step + r))
                       for r in range(nproc)])
        loss = nn.functional.mse_loss(model(x), x[:, :1] - 2 * x[:, 1:2])
        opt.zero_grad()
        loss.backward()
        opt.step()
    return [v for p in model.parameters() for v in p.detach().flatten().tolist()]


def judge(attempt: Attempt, nproc: int) -> Mismatch | None:
    return params_match(attempt, nproc, baseline(nproc), TOL)


def env_values(tree: ast.AST, name: str) -> list[str]:
    """The constant values ``os.environ[name] = "..."`` assigns in the code."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant):
            for t in node.targets:
                if isinstance(t, ast.Subscript) and isinstance(t.slice, ast.Constant) and t.slice.value == name:
                    out.append(str(node.value.value))
    return out


def _is_address(value: str) -> bool:
    try:
        ipaddress.ip_address(value.split(",")[0])
        return True
    except ValueError:
        return False


EXERCISE = Exercise(
    id="09", lab="09", title="An interface name from another machine",
    task="It trains on 2 ranks of this machine: every rank ends with the parameters one process gets from every "
         "rank's batches.",
    broken=BROKEN, reference=REFERENCE,
    hint="Read the error's last words: which name does gloo look for, and does this machine have an interface of "
         "that name (`ip -br addr`)? Which interface do two ranks on this one machine share?",
    judge=judge, nproc=2, stall_s=2.0, tolerance=TOL, failure="python-exception",
    wrong_fixes=(
        WrongFix(
            "nccl-exclusion-list",
            (Edit(_IFNAME, 'os.environ["GLOO_SOCKET_IFNAME"] = "^lo,docker"            # any interface but these\n'),),
            lambda a: not a.ok and any(v.startswith("^") for v in env_values(a.tree, "GLOO_SOCKET_IFNAME")),
            "'^lo,docker' is NCCL's syntax (NCCL_SOCKET_IFNAME accepts a prefix list and ^ to exclude). Gloo reads "
            "GLOO_SOCKET_IFNAME as interface names, literally: it now looks for an interface called '^lo' and "
            "fails the same way.",
            "https://github.com/aws-samples/aws-do-eks/pull/51 (GLOO_SOCKET_IFNAME='^lo,docker,veth,eni': "
            "'Unable to find address for: ^lo')"),
        WrongFix(
            "ip-address",
            (Edit(_IFNAME, 'os.environ["GLOO_SOCKET_IFNAME"] = "127.0.0.1"             # the address to use\n'),),
            lambda a: not a.ok and any(_is_address(v) for v in env_values(a.tree, "GLOO_SOCKET_IFNAME")),
            "GLOO_SOCKET_IFNAME takes the NAME of an interface (lo, eth0, ens5), not an address: gloo looks for an "
            "interface called '127.0.0.1' and does not find one. Give the name of the interface that carries "
            "that address (`ip -br addr` lists both).",
            "https://github.com/AMD-AGI/Primus/pull/1063 (an IP put into *_SOCKET_IFNAME: every rank died in Gloo "
            "with 'Unable to find address for: <ip>')"),
        WrongFix(
            "nccl-ifname",
            (Edit(_IFNAME, _IFNAME + 'os.environ["NCCL_SOCKET_IFNAME"] = "lo"                  '
                                     "# the network to use\n"),),
            lambda a: not a.ok and bool(env_values(a.tree, "NCCL_SOCKET_IFNAME"))
            and bool(env_values(a.tree, "GLOO_SOCKET_IFNAME")),
            "NCCL_SOCKET_IFNAME is read by NCCL only; this job runs on gloo, which reads GLOO_SOCKET_IFNAME, still "
            "set to an interface this machine does not have. Each backend has its own variable.",
            "https://github.com/aws-samples/aws-do-eks/pull/51 (NCCL's and Gloo's variables take different values: "
            "'I gave Gloo NCCL's exclusion list')"),
        WrongFix(
            "longer-timeout",
            (Edit("d = lab.setup()", "d = lab.setup(timeout_s=3600)"),),
            lambda a: has_keyword(a.tree, ("setup", "init_process_group"), "timeout", "timeout_s") and not a.ok,
            "Nothing is slow here: gloo fails at once when it looks for the interface, long before any timeout "
            "could end a wait. The timeout changes nothing about the name it looks for.",
            "https://github.com/ultralytics/ultralytics/pull/3343 (timeout raised from 1 to 3 hours)"),
    ),
    sources=("https://github.com/aws-samples/aws-do-eks/pull/51", "https://github.com/AMD-AGI/Primus/pull/1063"),
)
