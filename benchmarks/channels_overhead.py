"""What the rank hook's evidence channels (issue 41) cost on lab 07's training step.

    python benchmarks/channels_overhead.py [--steps 20] [--calls 3000] [--rounds 5]

The channels that run during training are the wrappers on torch.distributed's functions (each call
numbered, its call site and the exception in flight recorded); the others run only at an exit, an error
or when the launcher asks (threads, os._exit, a worker's exception). So the cost of a step is
(watched calls per step) x (the wrapper's cost per call) / (the step's time):
1. lab 07's step (benchmarks/check_step.py: width 2048, depth 4, batch 8, plain DDP, 2 gloo ranks) run
   through ddplab.run: its step time, and how many calls the hook recorded over the whole run (DDP's
   gradient all-reduces are issued from C++ and pass no wrapper);
2. the wrapper's cost per call, in this process: a 1-rank gloo group, all_reduce of one number called
   through the wrapper and through the function it wraps, in alternating blocks (same load), the
   median difference per call over rounds.
Target: under 1 % of a step without --check.
"""
import argparse
import importlib.util
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import ddplab
from ddplab import runfiles

ROOT = Path(__file__).resolve().parents[1]
STEP = ROOT / "benchmarks" / "check_step.py"
HOOK = ROOT / "src" / "ddplab" / "rank" / "hook" / "sitecustomize.py"


def per_call_us(calls: int, rounds: int) -> tuple[float, float, float]:
    """(the wrapper's extra microseconds per call, the unwrapped all_reduce's, the record's alone)."""
    import torch
    import torch.distributed as dist
    spec = importlib.util.spec_from_file_location("_ddplab_hook_bench", HOOK)
    hook = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hook)          # outside a run it installs nothing
    store = dist.HashStore()
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    record = hook._Calls()
    hook._watch_calls(record)
    watched = dist.all_reduce
    bare = watched.__ddplab_watched__
    t = torch.ones(1)
    extra, base, own, args = [], [], [], []
    for i in range(rounds):
        first, second = (bare, watched) if i % 2 == 0 else (watched, bare)   # each goes first in turn
        took = {}
        for fn in (first, second):
            t0 = time.perf_counter()
            for _ in range(calls):
                fn(t)
            took[fn] = (time.perf_counter() - t0) / calls * 1e6
        base.append(took[bare])
        extra.append(took[watched] - took[bare])
        # the record alone (what the wrapper does besides calling through): call site, exception, append
        frame = sys._getframe()
        t0 = time.perf_counter()
        for n in range(calls):
            record.append(hook._site("all_reduce", frame, n))
        own.append((time.perf_counter() - t0) / calls * 1e6)
        # the arguments' description alone (the record holds it since the arguments channel; 0 before it)
        describe = getattr(hook, "_call_args", None)
        t0 = time.perf_counter()
        for n in range(calls if describe is not None else 0):
            describe(bare, (t,), {})
        args.append((time.perf_counter() - t0) / calls * 1e6)
    dist.destroy_process_group()
    return statistics.median(extra), statistics.median(base), statistics.median(own) + statistics.median(args), \
        statistics.median(args)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--calls", type=int, default=3000)
    p.add_argument("--rounds", type=int, default=5)
    a = p.parse_args()
    r = ddplab.run(STEP, args=["--steps", str(a.steps)], run_root=tempfile.mkdtemp(prefix="ddplab-chan-"),
                   progress=None)
    assert r.ok, r.explain()
    step_ms = max(x["median_ms"] for x in r.records_of("steps"))
    ex = json.loads(Path(runfiles.rank_path(r.run_dir, 0, runfiles.EXIT)).read_text())
    recorded = len(ex.get("calls") or ())
    steps = a.steps + 3                   # check_step.py's warm-up steps run too
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    extra_us, base_us, own_us, args_us = per_call_us(a.calls, a.rounds)
    cost_us = max(extra_us, own_us)       # the difference of two timed loops is noisy; the record is not
    per_step = recorded / steps           # an upper bound: set-up calls are counted as if in the steps
    share = per_step * cost_us / (step_ms * 1e3)
    print(f"lab 07's step: {step_ms:.1f} ms; calls the hook recorded in the whole run: {recorded} "
          f"({', '.join(c['op'] for c in ex.get('calls') or ())}) over {steps} steps")
    print(f"the wrapper: {extra_us:.2f} us per call on top of a 1-number all_reduce of {base_us:.2f} us; the record "
          f"alone {own_us:.2f} us, of which the arguments' description {args_us:.2f} us (1-rank gloo, median of "
          f"{a.rounds} rounds of {a.calls})")
    print(f"share of lab 07's step: at most {per_step:.2f} calls/step x {cost_us:.2f} us = {100 * share:.4f} %")
    print(f"a step that also all-reduces one metric (Lightning's sync_dist): +{cost_us:.2f} us per call "
          f"= {100 * cost_us / (step_ms * 1e3):.4f} % of lab 07's step")


if __name__ == "__main__":
    main()
