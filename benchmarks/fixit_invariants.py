"""Issue 42's grading figures: every attempt of tests/fixit_corpus.py (wrong fixes from real reports that
no exercise lists, and valid alternatives) graded for real, with the time a learner waits for each grade.

    python benchmarks/fixit_invariants.py [--workers 1] [--only 06,07] [--cases 07-ddp-buckets] [--json out.json]

For each attempt: what it must be (rejected / passes), what the grade said (outcome, the named wrong fix or
the failed invariant with its layout), whether that is right (a rejection needs a reason: a wrong fix whose
evidence held, or an invariant with measured and expected values), and the wait: from the grade() call to
the Grade (every layout's run, the evidence, the verdict). With --workers 1 each grade has the machine to
itself, as a learner's would; more workers measure throughput, not the wait. Every number is from this one
execution on this machine; nothing here is a test (tests/test_fixit_corpus.py is).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workers", type=int, default=1, help="gradings at once (default 1: the learner's wait)")
    p.add_argument("--only", default="", help="comma-separated exercise ids (default: all)")
    p.add_argument("--cases", default="", help="comma-separated case ids (06-local-rank-as-rank; default: all)")
    p.add_argument("--json", default="", help="write the rows here")
    a = p.parse_args()
    os.environ.setdefault("DDPLAB_RUNS_DIR", tempfile.mkdtemp(prefix="ddplab-fixit-invariants-"))
    from fixit_corpus import CASES, REJECT
    from ddplab.course import fixit
    only = {i.strip() for i in a.only.split(",") if i.strip()}
    named = {i.strip() for i in a.cases.split(",") if i.strip()}
    cases = [c for c in CASES if (not only or c.exercise in only) and (not named or c.id in named)]

    def one(case):
        t0 = time.monotonic()
        g = fixit.grade(case.exercise, case.attempt(), progress=None, count=False)
        wait = time.monotonic() - t0
        m = g.mismatch
        reason = (f"wrong fix '{g.wrong_fix}'" if g.wrong_fix else
                  f"{m.kind}{' on ' + m.layout.key if m.layout else ''}: {m.what}" if m is not None else "")
        has_reason = bool(g.wrong_fix) or (m is not None and m.expected is not None and m.got is not None)
        right = (not g.passed and has_reason) if case.expect == REJECT else g.passed
        row = {"case": case.id, "expect": case.expect, "outcome": str(g.outcome), "reason": reason,
               "right": right, "wait_s": round(wait, 1), "runs": 1 + len(g.runs)}
        print(f"{case.id:32} {case.expect:6} {str(g.outcome):16} {'ok ' if right else 'BAD'} {wait:6.1f} s  "
              f"{row['runs']} run(s)  {reason}", flush=True)
        return row

    with ThreadPoolExecutor(max(1, a.workers)) as pool:
        rows = list(pool.map(one, cases))
    waits = [r["wait_s"] for r in rows]
    rejected = [r for r in rows if r["expect"] == REJECT]
    valid = [r for r in rows if r["expect"] != REJECT]
    print(f"\nwrong fixes rejected with a reason: {sum(r['right'] for r in rejected)}/{len(rejected)}; "
          f"valid alternatives passed: {sum(r['right'] for r in valid)}/{len(valid)}")
    print(f"wait for a grade ({a.workers} at once): median {statistics.median(waits):.1f} s, worst {max(waits):.1f} s "
          f"({rows[waits.index(max(waits))]['case']}), over {len(rows)} attempts")
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=1))
    return 0 if all(r["right"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
