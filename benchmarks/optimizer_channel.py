"""What --check's optimizer channel (issue 41) costs on lab 07's step.

    python benchmarks/optimizer_channel.py [--rounds 5] [--steps 20]

At every optimizer step the rank hook reads the param groups' numbers and compares them with the last
ones it kept (``_watch_optimizer`` in rank/hook/ddplab_rankcheck.py); the state's checksum is taken only at
the first step and after a load. This times, in one process and in alternating blocks (the same load on
both): lab 07's step (width 2048, depth 4, batch 8, SGD; one process, no DDP: the channel does not depend
on it) and the channel's call on that step's optimizer, and prints the median ratio. Target: under 1 %.
"""
import argparse
import importlib.util
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("lab07", ROOT / "labs" / "07_scaling.py")
lab07 = importlib.util.module_from_spec(spec)
spec.loader.exec_module(lab07)
sys.path.insert(0, str(ROOT / "src" / "ddplab" / "rank" / "hook"))
import ddplab_rankcheck as rc  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--calls", type=int, default=20000)
    a = p.parse_args()
    rc.S = rc._State(10)
    torch.manual_seed(0)
    model = lab07.make_model(2048, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    x, teacher = torch.randn(8, 2048), torch.randn(2048, 2048) / 2048 ** 0.5
    rc._watch_optimizer(torch, opt)          # the first call takes the state's checksum (empty here)
    ratios = []
    for _ in range(a.rounds):
        t = time.perf_counter()
        for _ in range(a.steps):
            opt.zero_grad()
            (model(x) - x @ teacher).pow(2).mean().backward()
            opt.step()
        step_s = (time.perf_counter() - t) / a.steps
        t = time.perf_counter()
        for _ in range(a.calls):
            rc._watch_optimizer(torch, opt)
        call_s = (time.perf_counter() - t) / a.calls
        ratios.append(call_s / step_s)
        print(f"step {step_s * 1e3:8.2f} ms   channel {call_s * 1e6:6.2f} us   {100 * call_s / step_s:.4f} %")
    print(f"median: {100 * statistics.median(ratios):.4f} % of lab 07's step")


if __name__ == "__main__":
    main()
