"""Each rank trains a model of its own, built in a function as pytorch/examples' imagenet main.py does on a
CPU (no DDP wrapper): the model and its optimizer are freed when the function returns, and the script never
ends its process group. --mode averaged all-reduces the gradients by hand (one model: nothing to name)."""
import argparse

import torch
import torch.distributed as dist


def main_worker(averaged: bool) -> None:
    torch.manual_seed(0)                      # the same initial weights on every rank
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(100 + dist.get_rank())    # each rank its own data
    for _ in range(4):
        opt.zero_grad()
        model(torch.randn(8, 4, generator=g)).pow(2).mean().backward()
        if averaged:
            for p in model.parameters():
                dist.all_reduce(p.grad)
                p.grad /= dist.get_world_size()
        opt.step()


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--mode", choices=["own", "averaged"], default="own")
    dist.init_process_group("gloo")
    main_worker(ap.parse_args().mode == "averaged")
    # no destroy_process_group(): the optimizer is gone before the job ends
