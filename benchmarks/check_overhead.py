"""What `ddplab run --check` costs on lab 07's training step (width 2048, depth 4, batch 8: 16.8 M
parameters, plain DDP on 2 gloo ranks), measured as ratios in one session (this machine is noisy).

    python benchmarks/check_overhead.py [--rounds 4] [--steps 40]

Each round runs benchmarks/check_step.py three times, back to back, in turn: without --check, with
--check at the default checksum interval (ddplab.check.EVERY), and with a checksum at every step
(interval 1). Each run records every rank's median ms per step (warm-up excluded; the slowest rank
counts). Printed: the median over rounds of each configuration against the run without the check
of the same round, and how many rounds the checked run was slower (a sign test's p). Goal: the
default interval costs under 5 % of a step.
"""
import argparse
import statistics
import tempfile
from pathlib import Path

import ddplab
from ddplab.check import ENV, EVERY
from ddplab.notebook import sign_test_p

STEP = Path(__file__).resolve().parent / "check_step.py"


def step_ms(result) -> float:
    assert result.ok, result.explain()
    return max(r["median_ms"] for r in result.records_of("steps"))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--steps", type=int, default=40)
    a = p.parse_args()
    root = tempfile.mkdtemp(prefix="ddplab-check-bench-")
    configs = {"off": {}, f"every {EVERY}": {"check": True}, "every 1": {"check": True, "env": {ENV: "1"}}}
    ratios = {k: [] for k in configs if k != "off"}
    for i in range(a.rounds):
        ms = {k: step_ms(ddplab.run(STEP, args=["--steps", str(a.steps)], run_root=root, progress=None, **kw))
              for k, kw in configs.items()}
        for k in ratios:
            ratios[k].append(ms[k] / ms["off"])
        print(f"round {i + 1}: " + ", ".join(f"{k} {v:.1f} ms" for k, v in ms.items()), flush=True)
    for k, rs in ratios.items():
        slower = sum(r > 1 for r in rs)
        print(f"--check {k}: median {100 * (statistics.median(rs) - 1):+.1f} % per step "
              f"(rounds slower: {slower}/{len(rs)}, sign test p = {sign_test_p(slower, len(rs)):.2f}); "
              f"{'within' if statistics.median(rs) < 1.05 else 'over'} the 5 % goal")


if __name__ == "__main__":
    main()
