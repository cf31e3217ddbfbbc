"""A script run under a framework that catches the script's exception, prints it and calls sys.exit(1),
as hydra's ``run_and_report`` does (hydra/_internal/utils.py): the rank's error is the exception, not
"SystemExit: 1" in the framework.

    torchrun --nproc-per-node 2 tests/scripts/reasons/hydra_like.py
"""
import sys
import traceback

import torch.distributed as dist


def run_and_report(func):
    """hydra/_internal/utils.py's shape: any exception is printed and turned into exit code 1."""
    try:
        return func()
    except Exception:
        traceback.print_exc()
        sys.exit(1)


def train():
    dist.init_process_group("gloo")
    cfg = {"optimizer": {"lr": 0.1}}
    lr = cfg["optim"]["lr"]                    # BROKEN: the config group is called "optimizer"
    print(lr)


if __name__ == "__main__":
    run_and_report(train)
