"""Re-capture the real messages of the known user mistakes (ddplab.engine.causes) the way capture.py does.

    python tests/data/capture_causes.py            # all cases, writes tests/data/real_<case>.txt
    python tests/data/capture_causes.py cuda_set_device_cpu_torch

Each case is the mistake as a learner's script makes it, run for real under torchrun (2 ranks,
gloo) or plain python (0); the output is saved unedited with a header naming torch's version.
"""
import sys

import capture

CASES = {
    "cuda_set_device_cpu_torch": (2, """
import os, torch, torch.distributed as dist
dist.init_process_group("gloo")
torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))     # a GPU script on a CPU-only torch
"""),
    "cuda_tensor_cpu_torch": (2, """
import torch, torch.distributed as dist
dist.init_process_group("gloo")
x = torch.ones(2).cuda()                                  # .cuda() on a CPU-only torch
"""),
    "ddp_device_ids_cpu": (2, """
import torch.nn as nn, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
dist.init_process_group("gloo")
DDP(nn.Linear(4, 1), device_ids=[dist.get_rank()])        # device_ids with a CPU module
"""),
    "gloo_ifname_exclusion": (2, """
import torch.distributed as dist
dist.init_process_group("gloo")                           # run with GLOO_SOCKET_IFNAME=^lo (NCCL's syntax)
"""),
    "launch_local_rank_arg": (2, """
import argparse, torch.distributed as dist
p = argparse.ArgumentParser()
p.add_argument("--local_rank", type=int, required=True)   # written for python -m torch.distributed.launch
args = p.parse_args()
dist.init_process_group("gloo")
"""),
    "no_torchrun": (0, """
import os, torch.distributed as dist
for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"): os.environ.pop(k, None)
dist.init_process_group("gloo")                           # python train.py instead of torchrun
"""),
    "pg_not_initialized": (2, """
import torch, torch.distributed as dist
rank = dist.get_rank()                                    # before init_process_group
dist.init_process_group("gloo")
"""),
    "pg_initialized_twice": (2, """
import torch.distributed as dist
dist.init_process_group("gloo")
dist.init_process_group("gloo")                           # a second time (a helper that also initialises)
"""),
    "fd_limit": (0, """
import os, resource, socket, torch.distributed as dist
with socket.socket() as s:
    s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
open_now = len(os.listdir("/proc/self/fd"))
resource.setrlimit(resource.RLIMIT_NOFILE, (open_now + 6, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
dist.init_process_group("gloo", rank=0, world_size=1)     # the master with `ulimit -n` too low for its store
"""),
    "rank_outside_world": (2, """
import os, torch.distributed as dist
rank = int(os.environ["RANK"]) + 1                        # ranks counted from 1: the last one is WORLD_SIZE
dist.init_process_group("gloo", rank=rank, world_size=int(os.environ["WORLD_SIZE"]))
"""),
    "nccl_without_gpu": (2, """
import torch, torch.distributed as dist
dist.init_process_group("nccl")                           # NCCL on a machine (or torch) with no GPU
dist.all_reduce(torch.ones(2))
"""),
    "no_backend_for_device": (2, """
import torch, torch.distributed as dist
dist.init_process_group("cuda:gloo")                      # a group for CUDA tensors only
dist.all_reduce(torch.ones(2))                            # ... given a CPU tensor
"""),
    "syncbn_cpu": (2, """
import torch, torch.nn as nn, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
dist.init_process_group("gloo")
m = DDP(nn.SyncBatchNorm(4))                              # SyncBatchNorm on CPU
m(torch.randn(3, 4)).sum().backward()
"""),
    "ddp_mark_ready_twice": (2, """
import torch, torch.nn as nn, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.checkpoint import checkpoint
dist.init_process_group("gloo")
class M(nn.Module):
    def __init__(self):
        super().__init__(); self.a = nn.Linear(4, 4); self.b = nn.Linear(4, 1)
    def forward(self, x):                                 # the same layer checkpointed twice (reentrant)
        return self.b(checkpoint(self.a, x, use_reentrant=True) + checkpoint(self.a, x, use_reentrant=True))
m = DDP(M(), find_unused_parameters=True)
m(torch.randn(2, 4, requires_grad=True)).sum().backward()
"""),
    "ddp_no_trainable_params": (2, """
import torch.nn as nn, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
dist.init_process_group("gloo")
m = nn.Linear(4, 1)
for p in m.parameters(): p.requires_grad_(False)          # a frozen model
DDP(m)
"""),
    "ddp_missing_attribute": (2, """
import torch.nn as nn, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
dist.init_process_group("gloo")
class Net(nn.Linear):
    def predict(self, x): return self(x).argmax(1)
m = DDP(Net(4, 2))
m.predict                                                 # a method of the model, asked of the wrapper
"""),
    "ddp_state_dict_prefix": (0, """
import os, torch, torch.nn as nn, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="0")
dist.init_process_group("gloo", rank=0, world_size=1)
state = DDP(nn.Linear(4, 1)).state_dict()                 # saved from the wrapper: keys 'module.weight'
nn.Linear(4, 1).load_state_dict(state)                    # loaded into the plain model
"""),
    "spawn_without_main_guard": (0, """
import torch.multiprocessing as mp
def work(rank): pass
mp.set_start_method("spawn", force=True)
mp.spawn(work, nprocs=2)                                  # no `if __name__ == "__main__":` around it
"""),
    "all_gather_list_size": (2, """
import torch, torch.distributed as dist
dist.init_process_group("gloo")
t = torch.ones(2)
dist.all_gather([torch.empty(2)], t)                      # one output tensor, two ranks
"""),
    "ddp_lazy_module": (2, """
import torch.nn as nn, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
dist.init_process_group("gloo")
DDP(nn.LazyLinear(4))                                     # shapes not known before a first forward
"""),
    "accelerator_index_cpu": (2, """
import os, torch, torch.nn as nn, torch.distributed as dist
dist.init_process_group("gloo")
gpu_id = int(os.environ["LOCAL_RANK"])
model = nn.Linear(4, 1).to(gpu_id)                        # pytorch/examples' Trainer: an int device on a CPU machine
"""),
    "accelerator_none": (2, """
import os, torch, torch.distributed as dist
rank = int(os.environ["LOCAL_RANK"])
device = torch.device(f"{torch.accelerator.current_accelerator().type}:{rank}")   # None on a CPU machine
"""),
    "device_count_zero": (2, """
import os, torch, torch.distributed as dist
dist.init_process_group("gloo")
device_id = dist.get_rank() % torch.cuda.device_count()   # 0 GPUs here
"""),
}
ENV = {"gloo_ifname_exclusion": {"GLOO_SOCKET_IFNAME": "^lo"}}

capture.CASES.update(CASES)
capture.ENV.update(ENV)

if __name__ == "__main__":
    for name in sys.argv[1:] or CASES:
        print(capture.capture(name))
