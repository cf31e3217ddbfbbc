"""Lab 06 benchmark: how long init_process_group takes to answer, measured inside the ranks.

    python benchmarks/lab06_timeouts.py            # the long sweep (a few minutes)
    python benchmarks/lab06_timeouts.py --quick    # the notebook's CI-sized sweep

1. late rank: one torchrun job, one real init_process_group per (timeout, delay) pair;
2. unreachable master: seconds until rank 1 gives up dialing a master that never answers, per
   timeout, for a network namespace that drops packets (root + ip netns) and for loopback where
   nothing listens (refused). Ratios (answer / timeout) are what to compare: the machine may be busy.
"""
from __future__ import annotations

import argparse
import sys
import tempfile

from ddplab.course import lab06


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="the notebook's short sweep, one unreachable timeout")
    a = p.parse_args()
    timeouts, delays = ([0.5, 1, 2, 4], [1.5]) if a.quick else ([0.5, 1, 2, 4, 8, 16], [1.5, 6])
    unreach_timeouts = [3.0] if a.quick else [2.0, 4.0, 8.0]
    root = tempfile.mkdtemp(prefix="ddplab-lab06-")

    s = lab06.timeout_sweep(timeouts, delays, run_root=root)
    print(f"late rank: one job, {len(s.points)} trials, status {s.status}, {s.wall_s:.1f} s wall")
    print(f"{'delay s':>8} {'timeout s':>10} {'outcome':>8} {'answer s':>9} {'answer/timeout':>15}")
    for q in s.points:
        print(f"{q['delay_s']:>8g} {q['timeout_s']:>10g} {q['outcome']:>8} {q['seconds']:>9.2f} "
              f"{q['seconds'] / q['timeout_s']:>15.2f}")

    kinds = ["netns", "loopback"] if lab06.netns_available()[0] else ["loopback"]
    if len(kinds) == 1:
        print(f"\n(no network namespace here: {lab06.netns_available()[1]}; loopback only)")
    print(f"\nunreachable master: seconds until rank 1 gives up")
    print(f"{'kind':>9} {'timeout s':>10} {'status':>7} {'signature':>18} {'gave up s':>10} {'ratio':>6}")
    for kind in kinds:
        for t in unreach_timeouts:
            r, m = lab06.run_unreachable(timeout_s=t, prefer=kind, run_root=root)
            g = lab06.give_up_seconds(r, 1)
            print(f"{m.kind:>9} {t:>10g} {r.status:>7} {str(r.signature):>18} "
                  f"{g if g is not None else float('nan'):>10.2f} {(g or float('nan')) / t:>6.2f}")
    left = lab06.leftover_namespaces()
    print(f"\nnamespaces left behind: {left or 'none'}; PyTorch's default timeout: {lab06.DEFAULT_PG_TIMEOUT_S:g} s")
    return 1 if left else 0


if __name__ == "__main__":
    sys.exit(main())
