"""Lab 07 benchmark: the full scaling sweep, every number from a real torchrun job started here.

    python benchmarks/lab07_scaling.py            # full sweep (several minutes on 2 CPU cores)
    python benchmarks/lab07_scaling.py --quick    # the notebook's CI-sized sweep

Prints, per configuration, step time, communication fraction (exposed all-reduce / step) and
samples/s; then the fixes against their baseline (measured in one job, interleaved rounds), the
world-size scaling (4 ranks on 2 cores is oversubscribed and says so), all-reduce bus bandwidth
against copy bandwidth, and the DataParallel traffic MODEL (real DataParallel when GPUs exist).
"""
from __future__ import annotations

import argparse
import os
import sys
import time

from ddplab.course import lab07 as L


def show(table) -> None:
    print(repr(table), end="\n\n", flush=True)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="the small CI sweep instead of the full one")
    a = p.parse_args()
    q = a.quick
    widths, batches = ([256, 1024], [8, 256]) if q else ([256, 1024, 2048], [8, 64, 256])
    worlds = [1, 2] if q else [1, 2, 4]
    steps, rounds = (3, 1) if q else (5, 3)
    t0 = time.monotonic()
    print(f"lab 07 scaling benchmark: {os.cpu_count()} cores, GPUs: {L.gpu_count()}, load average "
          f"{os.getloadavg()[0]:.1f} at start, steps {steps} x rounds {rounds} per configuration\n", flush=True)

    by_world = {}
    for w in worlds:
        r = L.run_grid(widths, batches, nproc=w, steps=steps, rounds=rounds)
        if not r.ok:
            print(r.explain())
            return 1
        by_world[w] = L.summarize(r)
        show(L.step_table(by_world[w], title=f"Plain DDP, {w} rank(s){' (OVERSUBSCRIBED: more ranks than cores)' if L.oversubscribed(w) else ''}, measured"))

    fw, fb = (1024, 8)
    fx = L.run_fixes(fw, fb, nproc=2, steps=steps, rounds=rounds)
    if not fx.ok:
        print(fx.explain())
        return 1
    frows = L.fix_rows(L.summarize(fx))
    show(L.fix_table(frows))
    best = L.best_fix(frows)
    print(f"best fix here: {best['label']}: {best['speedup']:.2f}x the baseline's samples/s "
          f"({frows[0]['samples_per_s']:.0f} -> {best['samples_per_s']:.0f} samples/s; communication "
          f"{100 * frows[0]['comm_frac']:.0f}% -> {100 * best['comm_frac']:.0f}% of the step)\n")

    cfgs = [f"w{max(widths)}-b{min(batches)}-none", f"w{max(widths)}-b{max(batches)}-none"]
    rows = []
    for cfg in cfgs:
        for s in L.scaling_rows(by_world, cfg):
            rows.append([cfg, f"{s['world']}{' (oversubscribed)' if s['oversubscribed'] else ''}",
                         s["samples_per_s"], s["ideal"], s["speedup"], s["efficiency"], s["comm_frac"]])
    show(L.Table(["config", "world", "samples/s", "ideal", "speed-up", "efficiency", "comm fraction"], rows,
                 "Scaling with world size (measured; ideal = world x 1-rank rate, one core per rank)"))

    sizes = [4 ** k for k in range(5, 13 if q else 14)]
    lk = L.run_link(sizes, nproc=2, reps=3 if q else 10)
    lrows, copy_bw = L.link_rows(lk)
    show(L.Table(["bytes", "median us", "algbw GB/s", "busbw GB/s", "% of copy bw"],
                 [[x["bytes"], 1e6 * x["median_s"], x["algbw"] / 1e9, x["busbw"] / 1e9, 100 * x["busbw"] / copy_bw]
                  for x in lrows], f"All-reduce ({lrows[0]['backend']}, 2 ranks), measured; memory copy "
                                   f"{copy_bw / 1e9:.2f} GB/s"))

    if L.gpu_count() >= 1:
        show(L.dp_measured(L.run_dataparallel(fw, 64, steps=steps)))
    one = next(r for r in by_world[1] if r["config"] == cfgs[0])
    show(L.dp_table(L.dp_model(one["params"], one["batch"], one["width"], copy_bw, one["compute_s"] / one["batch"])))
    print(f"total {time.monotonic() - t0:.0f} s; load average {os.getloadavg()[0]:.1f} at the end")
    return 0


if __name__ == "__main__":
    sys.exit(main())
