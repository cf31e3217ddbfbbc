"""Base program: a point-to-point pipeline. Rank r is stage r of a chain of linear stages; micro-batches
go forward with send/recv from stage to stage, the loss is taken on the last stage, gradients come back
with send/recv in reverse order (GPipe-style, all forwards then all backwards), every stage steps its
own optimizer. CPU/gloo, any number of ranks >= 2.
The `# @site:` comments mark where mutation operators apply (removed from the mutants)."""

import torch
import torch.distributed as dist
import torch.nn as nn

WIDTH, MICRO, N_MICRO, STEPS = 16, 4, 4, 3


def main():
    dist.init_process_group("gloo")  # @site:init
    rank, world = dist.get_rank(), dist.get_world_size()
    prev_rank, next_rank = rank - 1, rank + 1  # @site:peers
    first, last = rank == 0, rank == world - 1
    torch.manual_seed(rank)
    stage = nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.Tanh())
    optimizer = torch.optim.SGD(stage.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(0)
    for step in range(STEPS):
        optimizer.zero_grad()
        inputs, outputs = [], []
        for m in range(N_MICRO):
            if first:
                x = torch.randn(MICRO, WIDTH, generator=g)
            else:
                x = torch.empty(MICRO, WIDTH)  # @site:recv_buf
                dist.recv(x, src=prev_rank, tag=m)  # @site:recv_act
            x.requires_grad_(not first)
            y = stage(x)
            if not last:
                dist.send(y.detach(), dst=next_rank, tag=m)  # @site:send_act
            inputs.append(x)
            outputs.append(y)
        for m in reversed(range(N_MICRO)):
            if last:
                outputs[m].pow(2).mean().backward()  # @site:loss
            else:
                grad = torch.empty(MICRO, WIDTH)
                dist.recv(grad, src=next_rank, tag=100 + m)  # @site:recv_grad
                outputs[m].backward(grad)
            if not first:
                dist.send(inputs[m].grad, dst=prev_rank, tag=100 + m)  # @site:send_grad
        optimizer.step()
        if last:
            print(f"[rank{rank}] step {step} done", flush=True)
    dist.barrier()  # @site:end_barrier
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
