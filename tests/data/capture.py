"""Re-capture the real PyTorch messages the signature tests match against.

    python tests/data/capture.py            # all cases, writes tests/data/real_<case>.txt
    python tests/data/capture.py port-in-use

Each case is a few lines of real distributed code run under torchrun (or plain python where the
failure happens before torchrun would help); its combined output is saved unedited, with a header
naming the command, the torch version and the date. CUDA and NCCL messages cannot be produced on a
CPU machine: those files (``real_cuda_oom.txt``, ``real_nccl_error.txt``) hold messages reported from
real runs in PyTorch's issue tracker, with their source.
"""
import datetime
import os
import socket
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent

CASES = {
    # name: (nproc or 0 for plain python, code)
    "collective_timeout": (2, """
import datetime, time, torch, torch.distributed as dist
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=2))
if dist.get_rank() == 1:
    time.sleep(6)          # rank 1 is elsewhere; rank 0 waits in all_reduce
dist.all_reduce(torch.ones(1))
"""),
    "port_in_use": (0, """
import os, socket, torch.distributed as dist
held = socket.socket(); held.bind(("127.0.0.1", 0)); held.listen()
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(held.getsockname()[1]))
dist.init_process_group("gloo", rank=0, world_size=1)
"""),
    "store_timeout": (0, """
import datetime, os, socket, torch.distributed as dist
s = socket.socket(); s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]; s.close()
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
# world_size 2, but only this rank ever starts
dist.init_process_group("gloo", rank=0, world_size=2, timeout=datetime.timedelta(seconds=3))
"""),
    "missing_master_env": (0, """
import os, torch.distributed as dist
for k in ("MASTER_ADDR", "MASTER_PORT"): os.environ.pop(k, None)
dist.init_process_group("gloo", rank=0, world_size=1)
"""),
    "cpu_oom": (2, """
import resource, torch, torch.distributed as dist
dist.init_process_group("gloo")
if dist.get_rank() == 0:
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    resource.setrlimit(resource.RLIMIT_AS, (4 * 2**30, hard))
    x = torch.empty(8 * 2**30, dtype=torch.uint8)   # 8 GiB under a 4 GiB cap
dist.barrier()
"""),
    "detail_mismatch": (2, """
import torch, torch.distributed as dist
dist.init_process_group("gloo")
n = 3 if dist.get_rank() == 0 else 4
dist.all_reduce(torch.ones(n))       # different shapes in one collective
"""),
    "gloo_size_mismatch": (2, """
import torch, torch.distributed as dist
dist.init_process_group("gloo")
n = 1 if dist.get_rank() == 0 else 3
dist.all_reduce(torch.ones(n))       # the same collective, different sizes, no DETAIL
"""),
    "allgather_ragged": (2, """
import torch, torch.distributed as dist
dist.init_process_group("gloo")
n = 3 if dist.get_rank() == 0 else 4
out = [torch.empty(n) for _ in range(dist.get_world_size())]
dist.all_gather(out, torch.ones(n))
"""),
    "unused_parameters": (2, """
import torch, torch.nn as nn, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
dist.init_process_group("gloo")
class M(nn.Module):
    def __init__(self):
        super().__init__(); self.used = nn.Linear(4, 1); self.unused = nn.Linear(4, 1)
    def forward(self, x): return self.used(x)
m = DDP(M())
for _ in range(2):
    m(torch.randn(2, 4)).sum().backward()
"""),
    "ddp_model_mismatch": (2, """
import torch, torch.nn as nn, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
dist.init_process_group("gloo")
DDP(nn.Linear(8, 4 + dist.get_rank()))   # a layer size that depends on the rank
"""),
}
ENV = {"detail_mismatch": {"TORCH_DISTRIBUTED_DEBUG": "DETAIL", "TORCH_CPP_LOG_LEVEL": "INFO"}}


def capture(name: str) -> Path:
    import torch

    nproc, code = CASES[name]
    script = HERE / f"_case_{name}.py"
    script.write_text(code)
    try:
        if nproc:
            cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc),
                   "--rdzv-backend", "c10d", "--rdzv-endpoint", "127.0.0.1:0", "--max-restarts", "0", str(script)]
        else:
            cmd = [sys.executable, str(script)]
        env = {**os.environ, "GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1", **ENV.get(name, {})}
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env)
    finally:
        script.unlink()
    header = (f"# captured from a real run: torch {torch.__version__}, {datetime.date.today()}, "
              f"exit {out.returncode}\n# case {name} in tests/data/capture.py\n")
    path = HERE / f"real_{name}.txt"
    path.write_text(header + out.stdout + out.stderr)
    return path


if __name__ == "__main__":
    for name in sys.argv[1:] or CASES:
        print(capture(name))
