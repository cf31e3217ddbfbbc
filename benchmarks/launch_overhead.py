"""What ddplab's launcher costs, measured as ratios in one run (this machine is noisy).

    python benchmarks/launch_overhead.py [--runs 5]

1. Median wall time of `ddplab run benchmarks/trivial.py` against bare torchrun on the same script
   (same rank count, same c10d rendezvous on a free loopback port), runs interleaved so both see the
   same machine. Target: ddplab <= 1.15x bare torchrun.
2. Seconds from the ranks' last progress to a returned diagnosis for lab 01's hang (the stall
   window, then evidence read, job ended, result built). Target: <= stall window + 2 s.
3. Warm agents (ddplab.origins.warm): in one process, as a notebook runs them, the median wall time of
   `ddplab.run` on the trivial script with torchrun's agent forked warm against started cold
   (DDPLAB_WARM_AGENT=0), interleaved. Target: warm <= 0.85x
   cold wall.
"""
import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
TRIVIAL = HERE / "trivial.py"


def timed(cmd: list[str], env: dict) -> float:
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=300)
    return time.perf_counter() - t0


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=5, help="runs of each launcher (default 5)")
    a = p.parse_args()
    runs_dir = tempfile.mkdtemp(prefix="ddplab-bench-")
    env = {**os.environ, "DDPLAB_RUNS_DIR": runs_dir, "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo"}
    bare_cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", "2",
                "--rdzv-backend", "c10d", "--rdzv-endpoint", "127.0.0.1:0", str(TRIVIAL)]
    ddplab_cmd = [sys.executable, "-m", "ddplab.cli", "run", str(TRIVIAL), "--nproc", "2", "--quiet"]
    bare, ours = [], []
    timed(bare_cmd, env)  # warm the page cache for both
    for i in range(a.runs):
        bare.append(timed(bare_cmd, env))
        ours.append(timed(ddplab_cmd, env))
        print(f"run {i + 1}: bare torchrun {bare[-1]:.2f} s, ddplab run {ours[-1]:.2f} s", flush=True)
    mb, mo = statistics.median(bare), statistics.median(ours)

    import ddplab
    lags = []
    for i in range(3):
        r = ddplab.run("01", variant="broken", run_root=runs_dir, progress=None)
        lags.append(r.wall_s - r.stall.since_s if r.stall else float("nan"))
        print(f"hang {i + 1}: {r.status} [{r.signature}] returned {lags[-1]:.2f} s after the ranks' last progress",
              flush=True)

    warm_s, cold_s = [], []
    for i in range(a.runs + 1):
        for kind, out in (("cold", cold_s), ("warm", warm_s)):
            os.environ["DDPLAB_WARM_AGENT"] = "0" if kind == "cold" else "1"
            t0 = time.perf_counter()
            r = ddplab.run(str(TRIVIAL), nproc=2, run_root=runs_dir, progress=None)
            if i:   # the first pair starts the warm process: not a steady-state run
                out.append(time.perf_counter() - t0)
            assert r.status == "ok", r.headline()
        if i:
            print(f"pair {i}: cold agent {cold_s[-1]:.2f} s, warm agent {warm_s[-1]:.2f} s", flush=True)
    os.environ.pop("DDPLAB_WARM_AGENT")
    mw, mc = statistics.median(warm_s), statistics.median(cold_s)

    print()
    print(f"{'measure':<48} {'value':>10}")
    print(f"{'median wall, bare torchrun (s)':<48} {mb:>10.2f}")
    print(f"{'median wall, ddplab run (s)':<48} {mo:>10.2f}")
    print(f"{'ratio ddplab / bare (target <= 1.15)':<48} {mo / mb:>10.3f}")
    print(f"{'last progress -> diagnosis, median of 3 (s, <= 5)':<48} {statistics.median(lags):>10.2f}")
    print(f"{'last progress -> diagnosis, worst of 3 (s)':<48} {max(lags):>10.2f}")
    print(f"{'median ddplab.run, cold agent (s)':<48} {mc:>10.2f}")
    print(f"{'median ddplab.run, warm agent (s)':<48} {mw:>10.2f}")
    print(f"{'ratio warm / cold (target <= 0.85)':<48} {mw / mc:>10.3f}")


if __name__ == "__main__":
    main()
