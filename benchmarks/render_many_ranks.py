"""Judging and rendering a hang of many ranks: how long from evidence to the explanation?

    python benchmarks/render_many_ranks.py [--nproc 1024] [--rounds 5]

Synthetic evidence (tests/many_ranks.py: every rank's stack, ledger of 21 collectives and output,
one rank in barrier #21 while the others are in all_reduce #21) is judged by ``classify.verdict``
as a real run's is, then shown as text (``explain``), HTML and the ``--json`` groups. Reports the
median of the rounds for each part, the explanation's line count and the groups. Goal: judging +
rendering 1,024 ranks under 1 s.

Measured here (2 shared cores, torch 2.13 CPU, Python 3.11) at 1,024 ranks, median of 5 rounds:
at load average 4.4: judge 0.09-0.11 s, text 0.023 s (with the wait sentence), HTML 0.026 s, groups JSON
0.003 s; total 0.14-0.16 s. At load average 18 (six engineers' tests): judge 0.40 s, total 0.45 s.
The explanation: 9 lines, 2 groups, at any number of ranks.
"""
import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))


def main(nproc: int, rounds: int) -> dict:
    import many_ranks
    from ddplab.engine import groups

    parts: dict[str, list[float]] = {"judge": [], "text": [], "html": [], "json": []}
    for i in range(rounds):
        t0 = time.perf_counter()
        r = many_ranks.judged(nproc, odd=(nproc // 2 + i) % nproc)
        t1 = time.perf_counter()
        text = r.explain()
        t2 = time.perf_counter()
        r._repr_html_()
        t3 = time.perf_counter()
        json.dumps(groups.to_dicts(r))
        t4 = time.perf_counter()
        for k, a, b in (("judge", t0, t1), ("text", t1, t2), ("html", t2, t3), ("json", t3, t4)):
            parts[k].append(b - a)
    med = {k: round(statistics.median(v), 4) for k, v in parts.items()}
    med["total"] = round(sum(med.values()), 3)
    med.update(nproc=nproc, lines=len(text.splitlines()), groups=len(groups.group(r)), goal_s=1.0)
    print(text)
    return med


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--nproc", type=int, default=1024)
    p.add_argument("--rounds", type=int, default=5)
    a = p.parse_args()
    out = main(a.nproc, a.rounds)
    print(json.dumps(out))
    print(f"judge + render {out['total']:.2f} s for {out['nproc']} ranks (goal < {out['goal_s']:g} s): "
          f"{'met' if out['total'] < out['goal_s'] else 'NOT met'}")
