"""Errors that match no catalog entry: a learner's own bug (KeyError) or a usage error (argparse -> SystemExit 2).

    torchrun --nproc-per-node 2 tests/scripts/no_signature.py --mode keyerror
    torchrun --nproc-per-node 2 tests/scripts/no_signature.py            # usage error: --mode is required
"""
import argparse

import torch
import torch.distributed as dist


def main(mode: str) -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    config = {"lr": 0.1, "batch_size": 8}
    dist.all_reduce(torch.ones(2))
    if mode == "keyerror" and rank == 1:
        print(config["warmup_steps"])          # a key the config does not have
    dist.barrier()


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--mode", choices=["keyerror", "ok"], required=True)
    main(p.parse_args().mode)
