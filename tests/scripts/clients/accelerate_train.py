"""A Hugging Face accelerate job as a user writes one (under torchrun, CPU), tiny.

    torchrun --nproc-per-node 2 accelerate_train.py --mode ok

Modes: ok; gather (the main process alone calls ``accelerator.gather_for_metrics``); wait (the main
process alone calls ``accelerator.wait_for_everyone()``).
"""
import argparse

import torch
from accelerate import Accelerator
from torch.utils.data import DataLoader, TensorDataset


def main(mode, *, steps=4):
    torch.manual_seed(0)
    accelerator = Accelerator(cpu=True)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    data = DataLoader(TensorDataset(torch.randn(64, 4), torch.randn(64, 1)), batch_size=8)
    model, opt, data = accelerator.prepare(model, opt, data)
    for step, (x, y) in enumerate(data):
        if step == steps:
            break
        loss = torch.nn.functional.mse_loss(model(x), y)
        accelerator.backward(loss)
        opt.step()
        opt.zero_grad()
        if step == 1 and accelerator.is_main_process:
            if mode == "gather":
                accelerator.gather_for_metrics(loss.detach())
            if mode == "wait":
                accelerator.wait_for_everyone()
    print(f"rank {accelerator.process_index}: finished {step} steps")


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--mode", default="ok", choices=["ok", "gather", "wait"])
    main(p.parse_args().mode)
