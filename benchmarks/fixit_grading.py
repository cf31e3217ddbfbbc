"""Fix-it grading: how long from start to verdict for a hung attempt, against the stall window plus start-up?

    python benchmarks/fixit_grading.py [--rounds 2] [--only 02,05]

For every exercise whose failure is a hang, each attempt that hangs (its broken script, or a known wrong
fix, when the run is judged hung) is graded for real, ``rounds`` times, and timed from the grade() call to the Grade
(the whole grader: the script written, torchrun started, the stall rule, the evidence read, the job
ended, the grade made). Start-up is measured in the same rounds, the same way (``run_source`` with the
exercise's ranks and ``--check``), on a script that joins the process group and leaves at once. The
numbers to read:

    overhead = time to verdict (hung) - stall window - start-up

what the stall rule's confirmation, the evidence and the ending of the job cost beyond the window itself
(it also holds the hung script's own work before it stalls), and ``after last progress`` = the run's
``wall_s - stall.since_s`` (as benchmarks/verdict_latency.py): the window plus the verdict's own cost.
For an exercise whose broken script fails or ends ok, its broken script is graded the same way and
listed apart (verdict against start-up: what the run's own work and the grader's evidence cost).
Every number is from this one execution on this machine; nothing here is a test.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time


STARTUP = """\
import torch.distributed as dist
dist.init_process_group("gloo")
dist.barrier()                 # every rank in before any leaves (a rank leaving first ends its peer's init)
dist.destroy_process_group()
"""


def startup(nproc: int) -> float:
    from ddplab.course.magic import run_source
    t0 = time.monotonic()
    r = run_source(STARTUP, "startup", nproc=nproc, check=True, progress=None)
    if r.status != "ok":
        raise SystemExit(f"the start-up script did not end ok ({r.status}): see {r.run_dir}")
    return time.monotonic() - t0


def timed(exercise_id: str, source: str):
    from ddplab.course import fixit
    t0 = time.monotonic()
    g = fixit.grade(exercise_id, source, progress=None, count=False)
    return time.monotonic() - t0, g


def not_hung(ex, rounds: int) -> dict:
    """The broken script of an exercise that does not hang, graded ``rounds`` times, with start-up."""
    verdicts, ref, outcome = [], [], ""
    for _ in range(rounds):
        t, g = timed(ex.id, ex.broken)
        outcome = f"{g.result.status}/{g.outcome}"
        verdicts.append(t)
        ref.append(startup(ex.nproc))
    row = {"exercise": ex.id, "outcome": outcome, "verdict_s": statistics.median(verdicts),
           "startup_s": statistics.median(ref), "n": rounds}
    print(f"{ex.id} broken {outcome}: verdict {row['verdict_s']:5.1f} s; start-up {row['startup_s']:4.1f} s "
          f"({rounds} rounds)", flush=True)
    return row


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=2, help="gradings of each attempt (default 2)")
    p.add_argument("--only", default="", help="comma-separated exercise ids (default: all)")
    a = p.parse_args()
    only = {i.strip() for i in a.only.split(",") if i.strip()}
    os.environ.setdefault("DDPLAB_RUNS_DIR", tempfile.mkdtemp(prefix="ddplab-fixit-bench-"))
    from ddplab.course import fixit
    rows, others = [], []
    for ex in fixit.exercises():
        if only and ex.id not in only:
            continue
        if not ex.failure.startswith("hang"):
            others.append(not_hung(ex, a.rounds))     # its broken script fails or ends ok: nothing of it hangs
            continue
        attempts = [("broken", ex.broken)] + [(w.key, w.write(ex.broken)) for w in ex.wrong_fixes]
        for key, source in attempts:
            hung, ref = [], []
            for _ in range(a.rounds):
                t, g = timed(ex.id, source)
                if g.result.status != "hung":
                    break
                t_ref = startup(ex.nproc)
                hung.append((t, g.result.wall_s - g.result.stall.since_s))
                ref.append(t_ref)
            if not hung:
                continue
            t_med = statistics.median(t for t, _ in hung)
            ref_med = statistics.median(ref)
            row = {"exercise": ex.id, "attempt": key, "stall_s": ex.stall_s, "verdict_s": t_med,
                   "startup_s": ref_med, "overhead_s": t_med - ex.stall_s - ref_med,
                   "after_s": statistics.median(i for _, i in hung), "n": len(hung)}
            rows.append(row)
            print(f"{ex.id} {key:<16} hung: verdict {t_med:5.1f} s; stall window {ex.stall_s:g} s + start-up "
                  f"{ref_med:4.1f} s = {ex.stall_s + ref_med:5.1f} s; overhead "
                  f"{row['overhead_s']:+5.1f} s; verdict {row['after_s']:.1f} s after the last progress "
                  f"({len(hung)} rounds)", flush=True)
    print()
    print(f"{'ex':>3} {'attempt':<16} {'verdict s':>10} {'window+start s':>15} {'ratio':>6}")
    for r in rows:
        print(f"{r['exercise']:>3} {r['attempt']:<16} {r['verdict_s']:10.1f} {r['stall_s'] + r['startup_s']:15.1f} "
              f"{r['verdict_s'] / (r['stall_s'] + r['startup_s']):6.2f}")
    if others:
        print()
        print(f"{'ex':>3} {'broken script':<16} {'verdict s':>10} {'start-up s':>11} {'ratio':>6}")
        for r in others:
            print(f"{r['exercise']:>3} {r['outcome']:<16} {r['verdict_s']:10.1f} {r['startup_s']:11.1f} "
                  f"{r['verdict_s'] / r['startup_s']:6.2f}")
    print(f"cores: {os.cpu_count()}, load average at the end: {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
