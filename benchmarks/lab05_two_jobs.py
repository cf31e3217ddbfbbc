"""Lab 05 benchmark: two 2-rank jobs started at the same moment, on one fixed port vs. port 0.

    python benchmarks/lab05_two_jobs.py            # 20 pairs with port 0 (fixed-free-port), 10 on one port
    python benchmarks/lab05_two_jobs.py --quick    # 3 and 3

Prints the outcome counts of each and the seconds to a clear outcome of each single-job variant,
all measured in this run (real torchrun jobs, gloo, 127.0.0.1). Ends non-zero if a fixed-free-port
pair did not both succeed.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time

from ddplab.course import lab05


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="3 pairs of each instead of 20 / 10")
    p.add_argument("--fixed-pairs", type=int, default=None, help="pairs of fixed-free-port (default 20)")
    p.add_argument("--race-pairs", type=int, default=None, help="pairs of two-jobs on one port (default 10)")
    a = p.parse_args()
    n_fixed = a.fixed_pairs or (3 if a.quick else 20)
    n_race = a.race_pairs or (3 if a.quick else 10)
    root = tempfile.mkdtemp(prefix="lab05-bench-")
    t0 = time.monotonic()

    singles = {}
    for v in ("port-taken", "article-retry", "fixed-retry", "fixed-free-port"):
        singles[v] = lab05.run_variant(v, run_root=root)   # article-retry: ended by the stall rule
    print(f"{'variant':<16} {'status':<7} {'signature':<16} {'wall s':>7}  rank 0 error after (s)")
    for v, r in singles.items():
        print(f"{v:<16} {r.status:<7} {str(r.signature):<16} {r.wall_s:>7.1f}  {lab05.seconds_to_error(r)}")
    pic = lab05.retry_picture(singles["article-retry"])
    print(f"  article-retry: {pic.status} [{pic.signature}] in {pic.wall_s:.1f} s: sleeping ranks {list(pic.sleeping)},"
          f" ranks at the rendezvous {list(pic.at_rendezvous)}, no progress for {pic.idle_s} s"
          f" (the job itself: silent for 60 s); port-taken without the sleep: {singles['port-taken'].wall_s:.1f} s\n")

    race = lab05.two_jobs("two-jobs", repetitions=n_race, run_root=root)
    fixed = lab05.two_jobs("fixed-free-port", repetitions=n_fixed, run_root=root)
    for name, pairs in (("two-jobs (one fixed port)", race), ("fixed-free-port (port 0)", fixed)):
        print(f"{name}: {len(pairs)} pairs")
        print(lab05.pair_table(pairs))
        c = {k: v for k, v in lab05.counts(pairs).items() if v}
        print(f"  counts: {c}; median pair {statistics.median(p.wall_s for p in pairs):.1f} s\n")
    left = [pid for pairs in (race, fixed) for p in pairs for r in p.results for pid in r.leftover]
    ok = lab05.counts(fixed)["both ok"]
    print(f"fixed-free-port: {ok} of {len(fixed)} pairs both succeeded; leftover processes: {left or 'none'}; "
          f"total {time.monotonic() - t0:.0f} s; runs in {root}")
    return 0 if ok == len(fixed) and not left else 1


if __name__ == "__main__":
    sys.exit(main())
