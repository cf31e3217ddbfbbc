"""Verdicts on a loaded machine: are they right, and how long after the ranks stop do they come?

    python benchmarks/verdict_latency.py [--loads 1,3,4.5] [--stall 3]

For each load L (jobs per CPU core), starts round(L x cores) runs of lab 01 at once, half `broken`
(must be `hung`) and half `fixed-sampler` (must be `ok`), as a workshop on one shared machine
would. Reports per load: correct verdicts, false hangs (a fixed run called hung), and the verdict
latency of the hung runs, measured from the ranks' last progress to the returned result
(``wall_s - stall.since_s``: the stall window plus reading the evidence and ending the job).
Targets: every verdict correct at every load; latency median <= stall + 2 s at 1 job per core.
Everything is a ratio or a count of this one run; nothing here is a test.
"""
import argparse
import os
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor


def one_load(load: float, stall_s: float, runs_dir: str) -> dict:
    import ddplab

    cores = os.cpu_count() or 1
    n = max(2, round(load * cores))
    variants = ["broken" if i % 2 == 0 else "fixed-sampler" for i in range(n)]
    t0 = time.monotonic()
    with ThreadPoolExecutor(max_workers=n) as pool:
        results = list(pool.map(lambda v: ddplab.run("01", variant=v, stall_s=stall_s, run_root=runs_dir,
                                                      progress=None), variants))
    expected = {"broken": ("hung", "hang-different-collectives"), "fixed-sampler": ("ok", None)}
    correct = sum((r.status, r.signature) == expected[r.variant] for r in results)
    false_hangs = sum(r.variant == "fixed-sampler" and r.status != "ok" for r in results)
    lat = [r.wall_s - r.stall.since_s for r in results if r.status == "hung" and r.stall]
    leftovers = sum(len(r.leftover) for r in results)
    return {"load": load, "jobs": n, "correct": correct, "false_hangs": false_hangs, "leftovers": leftovers,
            "latency_median_s": statistics.median(lat) if lat else float("nan"),
            "latency_max_s": max(lat) if lat else float("nan"),
            "fixed_wall_median_s": statistics.median([r.wall_s for r in results if r.variant == "fixed-sampler"]),
            "batch_s": time.monotonic() - t0,
            "wrong": [(r.variant, r.status, r.signature) for r in results if (r.status, r.signature) != expected[r.variant]]}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--loads", default="1,3,4.5", help="jobs per CPU core, comma-separated (default 1,3,4.5)")
    p.add_argument("--stall", type=float, default=3.0, help="stall window in seconds (default 3)")
    a = p.parse_args()
    runs_dir = tempfile.mkdtemp(prefix="ddplab-bench-")
    rows = []
    for load in (float(x) for x in a.loads.split(",")):
        row = one_load(load, a.stall, runs_dir)
        rows.append(row)
        print(f"load {row['load']:g}/core: {row['jobs']} jobs, {row['correct']}/{row['jobs']} correct, "
              f"{row['false_hangs']} false hangs, hang verdict {row['latency_median_s']:.1f} s median / "
              f"{row['latency_max_s']:.1f} s max after the last progress, {row['batch_s']:.0f} s in all"
              + (f"; wrong: {row['wrong']}" if row["wrong"] else ""), flush=True)
    print()
    print(f"{'jobs/core':>9} {'jobs':>5} {'correct':>8} {'false hangs':>12} {'latency med':>12} {'latency max':>12} {'fixed wall med':>15}")
    for r in rows:
        print(f"{r['load']:>9g} {r['jobs']:>5} {r['correct']:>8} {r['false_hangs']:>12} {r['latency_median_s']:>11.1f}s "
              f"{r['latency_max_s']:>11.1f}s {r['fixed_wall_median_s']:>14.1f}s")
    return 0 if all(r["correct"] == r["jobs"] and not r["leftovers"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
