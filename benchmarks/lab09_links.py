"""Lab 09's full measurement: DDP step time against link rate (plain, fp16, bf16, PowerSGD at every
rate) and against packet loss, each point a real two-node job (ddplab.origins.cluster). Needs root.

    .venv/bin/python benchmarks/lab09_links.py [--steps 20] [--out build/lab09_links.json]

Prints one line per point and writes every point as JSON; the notebook runs a small part of this.
"""
import argparse
import json
import sys
from dataclasses import asdict
from pathlib import Path

from ddplab.course import lab09


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--rates", default="none,2000,1000,500,300,100,50")
    p.add_argument("--hooks", default="fp16,bf16,powersgd")
    p.add_argument("--losses", default="0,1,5,10")
    p.add_argument("--out", default="build/lab09_links.json")
    a = p.parse_args()
    need = lab09.requirement()
    if need:
        print(need, file=sys.stderr)
        return 2
    rates = [None if r == "none" else float(r) for r in a.rates.split(",")]
    points = lab09.sweep(rates=rates, compress_at=rates, hooks=a.hooks.split(","), steps=a.steps, progress=None)
    for pt in points:
        print(f"{pt.label:>14} {pt.hook:>9}: {pt.status} step {pt.step_ms} ms compute {pt.compute_ms} ms init {pt.init_s} s")
    for g in lab09.gains(points):
        print(f"{g['rate']:>14} {g['hook']:>9}: {g['speedup']}x over plain")
    loss = []
    for pct in (int(x) for x in a.losses.split(",")):
        r = lab09.run_variant("lossy-link", drop_percent=pct, steps=a.steps, progress=None)
        row = {"drop_percent": pct, "status": r.status, **(lab09.step_facts(r) if r.status == "ok" else {})}
        loss.append(row)
        print(f"loss {pct:>3}%: {row}")
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"points": [asdict(pt) for pt in points], "gains": lab09.gains(points), "loss": loss},
                              indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
