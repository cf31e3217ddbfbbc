"""A script whose ranks are asked for evidence (ddplab's probes) while they exit. At the end each
rank's main thread keeps the GIL for one long stretch of pure Python, so a probe's handler, which
needs the GIL, is still waiting for it when the interpreter starts to exit. The job must end ok.

    torchrun --nproc-per-node 2 tests/scripts/probed_at_exit.py --go GO_FILE
"""
import argparse
import os
import sys
import time

import torch.distributed as dist


def main(go: str, *, work: int = 30_000_000) -> None:
    dist.init_process_group("gloo")
    dist.barrier()
    while not os.path.exists(go):      # the prober has had an answer from every rank
        time.sleep(0.01)
    sys.setswitchinterval(60)          # the main thread keeps the GIL while it computes
    total = 0
    for i in range(work):
        total += i
    print(f"rank {dist.get_rank()} done: {total}")
    dist.destroy_process_group()


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--go", required=True)
    main(p.parse_args().go)
