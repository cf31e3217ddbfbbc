"""K learners on one machine: do their verdicts stay right, and how long do their runs take?

    python benchmarks/classroom.py [--learners 1 2 4 6] [--json build/classroom.json]

For each K, K learner processes start at once, each running the same lab sequence through
`ddplab.run` with its own runs folder (as each learner's kernel would): lab 01 broken and
fixed-sampler, lab 03 gather-ragged and fixed-pad-gather. Every result is judged against the
catalog (status and signature); the parent samples each learner's process tree for its peak
resident memory. Prints, per K: verdicts right out of total, median and slowest run seconds, the
slowest learner's sequence, peak memory of one learner and of all, the machine's mean load
average during the round (other users' jobs count: say it with the numbers); then the largest K that stayed
right, which `ddplab classroom check` and docs/instructor.md quote (ddplab/classroom.py holds the
per-learner figures measured here).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

SEQUENCE = [("01", "broken"), ("01", "fixed-sampler"), ("03", "gather-ragged"), ("03", "fixed-pad-gather")]

LEARNER = r"""
import json, sys, ddplab
for lab, variant in json.loads(sys.argv[1]):
    r = ddplab.run(lab, variant=variant, progress=None)
    print(json.dumps({"lab": lab, "variant": variant, "status": r.status, "signature": r.signature,
                      "wall_s": r.wall_s, "leftover": list(r.leftover)}), flush=True)
"""


def _tree_rss(p: psutil.Process) -> int:
    total = 0
    try:
        for q in [p, *p.children(recursive=True)]:
            try:
                total += q.memory_info().rss
            except psutil.Error:
                pass
    except psutil.Error:
        pass
    return total


def one_round(k: int, root: Path) -> dict:
    from ddplab.origins import catalog

    procs = []
    for i in range(k):
        runs = root / f"k{k}-learner{i}"
        runs.mkdir(parents=True)
        env = {**os.environ, "DDPLAB_RUNS_DIR": str(runs)}
        procs.append(subprocess.Popen([sys.executable, "-c", LEARNER, json.dumps(SEQUENCE)], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                                      start_new_session=True))
    t0 = time.monotonic()
    peak_each = [0] * k
    peak_all = 0
    ps = [psutil.Process(p.pid) for p in procs]
    loads = []
    while any(p.poll() is None for p in procs):
        loads.append(os.getloadavg()[0])
        now = [_tree_rss(q) for q in ps]
        peak_each = [max(a, b) for a, b in zip(peak_each, now)]
        peak_all = max(peak_all, sum(now))
        time.sleep(0.25)
    seconds = time.monotonic() - t0
    rows = []
    for p in procs:
        out, _ = p.communicate()
        rows.append([json.loads(line) for line in out.splitlines() if line.startswith("{")])
    right = total = 0
    walls = []
    wrong = []
    for i, learner in enumerate(rows):
        for r in learner:
            v = catalog.find_lab(r["lab"]).variant(r["variant"])
            ok = r["status"] == v.expect and (v.signature is None or r["signature"] == v.signature) and not r["leftover"]
            right += ok
            walls.append(r["wall_s"])
            if not ok:
                wrong.append({"learner": i, **r})
        total += len(SEQUENCE)
    return {"k": k, "right": right, "total": total, "all_right": right == total, "wrong": wrong,
            "median_run_s": round(statistics.median(walls), 1) if walls else None,
            "slowest_run_s": round(max(walls), 1) if walls else None,
            "sequence_s": round(seconds, 1),
            "peak_learner_mb": max(peak_each) // 2**20, "peak_all_mb": peak_all // 2**20,
            "load_avg": round(statistics.mean(loads), 1) if loads else None}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--learners", type=int, nargs="+", default=[1, 2, 4, 6], help="values of K (default 1 2 4 6)")
    p.add_argument("--json", help="also write the rows here")
    a = p.parse_args()
    root = Path(tempfile.mkdtemp(prefix="ddplab-classroom-"))
    cores = os.cpu_count()
    print(f"K learners at once on {cores} cores, each: " + ", ".join(f"{l} {v}" for l, v in SEQUENCE), flush=True)
    print(f"{'K':>3} {'right':>7} {'median run s':>13} {'slowest run s':>14} {'sequence s':>11} "
          f"{'learner MB':>11} {'all MB':>7} {'load':>5}", flush=True)
    rows = []
    for k in a.learners:
        r = one_round(k, root)
        rows.append(r)
        print(f"{k:>3} {r['right']:>3}/{r['total']:<3} {r['median_run_s']:>13} {r['slowest_run_s']:>14} "
              f"{r['sequence_s']:>11} {r['peak_learner_mb']:>11} {r['peak_all_mb']:>7} {r['load_avg']:>5}"
              + ("" if r["all_right"] else f"   wrong: {r['wrong']}"), flush=True)
    # the largest K below which every K tried kept every verdict right (one wrong verdict ends it)
    best = 0
    for r in sorted(rows, key=lambda r: r["k"]):
        if not r["all_right"]:
            break
        best = r["k"]
    load = os.getloadavg()
    print(f"largest K with every verdict right here: {best} ({best * 2 / cores:g} ranks per core); "
          f"load average at the end {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}")
    if a.json:
        Path(a.json).parent.mkdir(parents=True, exist_ok=True)
        Path(a.json).write_text(json.dumps({"cores": cores, "sequence": SEQUENCE, "rows": rows,
                                            "largest_k_right": best, "loadavg": load}, indent=2))


if __name__ == "__main__":
    main()
