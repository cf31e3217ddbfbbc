"""Lab 02 figures: peak-memory reduction with gradient accumulation 4, and time to failure of `oom`.

    python benchmarks/lab02_memory.py            # 3 repetitions
    python benchmarks/lab02_memory.py --quick    # 1 repetition

Each fixed-accumulate run measures both peaks in the same rank process (the gradient check runs the
full batch with the cap lifted), so the ratio is taken within one run. Memory is the peak above the
rank's baseline: peak RSS under an RLIMIT_DATA cap on CPU, the CUDA allocator's peak on a GPU.
"""
import argparse
import statistics

from ddplab.course import lab02


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="one repetition instead of three")
    p.add_argument("--mem-limit-mb", type=float, default=lab02.DEFAULT_MEM_LIMIT_MB, help="per-rank cap in MiB")
    a = p.parse_args()
    reps = 1 if a.quick else 3
    rows, fail_s = [], []
    for _ in range(reps):
        r = lab02.run("fixed-accumulate", mem_limit_mb=a.mem_limit_mb, accum=4)
        if not r.ok:
            raise SystemExit(f"fixed-accumulate --accum 4 {r.status} [{r.signature}]: {r.diagnosis}")
        rows.append(lab02.memory_figures(r))
        o = lab02.run("oom", mem_limit_mb=a.mem_limit_mb)
        fail_s.append((lab02.time_to_failure(o), lab02.seconds_after_long_step(o), o.status, o.signature))
    print(f"{'rep':>3} {'full batch MiB':>15} {'accum 4 MiB':>12} {'reduction':>10} {'max|dg|':>9} {'oom: s to failure':>18} {'s after long step':>18}")
    for i, (m, (s, after, st, sig)) in enumerate(zip(rows, fail_s)):
        print(f"{i:>3} {m['full_peak_mb']:>15.1f} {m['accum_peak_mb']:>12.1f} {m['reduction']:>9.1f}x "
              f"{m['max_abs_diff']:>9.1e} {s:>18.1f} {after:>18.2f}   ({st}, {sig})")
    print(f"median: {statistics.median(m['reduction'] for m in rows):.1f}x lower activation memory at accumulation 4 "
          f"(expected >= 2x); oom failed after a median {statistics.median(f[0] for f in fail_s):.1f} s "
          f"({statistics.median(f[1] for f in fail_s):.2f} s after the failing rank reached the long step)")


if __name__ == "__main__":
    main()
