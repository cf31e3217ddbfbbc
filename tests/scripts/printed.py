"""What the ranks print, compared across ranks (tests/test_printed.py): a small DDP job on gloo whose ranks
print their settings, their epochs and their own losses.

    torchrun --nproc-per-node 2 tests/scripts/printed.py --mode same|own-loss|lr-by-rank|run-dir|crash-early

same         every rank prints the same configuration, epochs and averaged loss: nothing differs
own-loss     every rank prints its rank, its pid and its own shard's loss every epoch: differs by nature
lr-by-rank   each rank updates by hand with lr scaled by its local rank and prints it every epoch (the replicas part)
run-dir      each rank names its run folder by the time (microseconds), rank 0 saves there, every rank loads from
             its own: rank 1 fails with FileNotFoundError (Lightning-AI/pytorch-lightning#5512)
crash-early  rank 1 raises after its first epoch: it printed fewer epochs because it stopped
epochs-by-rank  the number of epochs comes from an argument each rank reads for itself (3 + local rank): rank 0
             finishes while rank 1 starts a 4th epoch alone
"""
import argparse
import datetime
import os
import tempfile

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP


def main(mode):
    dist.init_process_group("gloo")
    rank, local_rank, world = dist.get_rank(), int(os.environ["LOCAL_RANK"]), dist.get_world_size()
    lr = 0.01 * (local_rank + 1) if mode == "lr-by-rank" else 0.01
    epochs = 3 + local_rank if mode == "epochs-by-rank" else 3
    print(f"config: epochs {epochs} | batch_size 8 | lr {lr} | world {world}", flush=True)
    if mode == "own-loss":
        print(f"[rank{rank}] pid {os.getpid()} local_rank={local_rank}", flush=True)
    torch.manual_seed(0)
    model = DDP(nn.Linear(8, 1))
    g = torch.Generator().manual_seed(100 + rank)
    data = [(torch.rand(8, 8, generator=g), torch.rand(8, 1, generator=g)) for _ in range(4)]
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    for epoch in range(epochs):
        total = 0.0
        for x, y in data:
            loss = F.mse_loss(model(x), y)
            model.zero_grad()
            loss.backward()
            if mode == "lr-by-rank":
                with torch.no_grad():       # the update by hand (no optimizer): each rank its own lr
                    for p in model.parameters():
                        p -= lr * p.grad
            else:
                opt.step()
            total += loss.item()
        mean = torch.tensor([total / len(data)])
        if mode == "own-loss":
            print(f"[rank{rank}] epoch {epoch} | loss {mean.item():.6f}", flush=True)
        dist.all_reduce(mean)
        print(f"epoch {epoch} | lr {lr} | loss {mean.item() / world:.6f}", flush=True)
        if mode == "crash-early" and rank == 1:
            raise RuntimeError("the data shard ran out")
    if mode == "run-dir":
        stamp = datetime.datetime.now().strftime("%Y-%m-%d_%H-%M-%S.%f")
        top = os.environ.get("DDPLAB_RUN_DIR") or tempfile.gettempdir()   # the run's own folder under ddplab
        run_dir = os.path.join(top, f"printed_{os.environ['MASTER_PORT']}", stamp)
        os.makedirs(run_dir, exist_ok=True)
        print(f"run dir: {run_dir}", flush=True)
        path = os.path.join(run_dir, "last.pt")
        if rank == 0:
            torch.save(model.module.state_dict(), path)
        dist.barrier()
        model.module.load_state_dict(torch.load(path))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--mode", default="same")
    main(ap.parse_args().mode)
