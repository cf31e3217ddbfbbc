"""ok-run wall time of real clients under `ddplab run` against bare torchrun, as ratios (issue 43).

    python benchmarks/client_overhead.py [--runs 3] [--imagenet PATH/TO/pytorch-examples/imagenet/main.py]

For each client (a PyTorch Lightning Trainer, an accelerate script: tests/scripts/clients/, mode ok;
pytorch/examples' imagenet main.py --dummy when its path is given and torchvision is installed): the
command's wall time as the user's clock sees it, `torchrun --nproc-per-node 2 script` against `ddplab run
script --nproc 2`, runs interleaved so both see the same machine; the median of each and their ratio.
"""
import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CLIENTS = ROOT / "tests" / "scripts" / "clients"


def timed(cmd: list[str], env: dict, cwd: str) -> float:
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, env=env, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                   timeout=900)
    return time.perf_counter() - t0


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=3, help="runs of each launcher (default 3)")
    p.add_argument("--imagenet", help="pytorch/examples' imagenet/main.py (needs torchvision)")
    a = p.parse_args()
    work = tempfile.mkdtemp(prefix="ddplab-clients-")
    env = {**os.environ, "DDPLAB_RUNS_DIR": os.path.join(work, "runs")}
    bindir = Path(sys.executable).parent
    jobs = {"lightning": [str(CLIENTS / "lightning_train.py"), "--mode", "ok"],
            "accelerate": [str(CLIENTS / "accelerate_train.py"), "--mode", "ok"]}
    if a.imagenet:
        jobs["imagenet --dummy"] = [a.imagenet, "--dummy", "-a", "resnet18", "--epochs", "1", "-b", "8",
                                    "--dist-backend", "gloo", "--multiprocessing-distributed"]
    for name, script in jobs.items():
        bare, ours = [], []
        for i in range(a.runs):
            port = str(29600 + i)
            bare.append(timed([str(bindir / "torchrun"), "--nproc-per-node", "2", "--master-port", port, *script],
                              env, work))
            ours.append(timed([str(bindir / "ddplab"), "run", script[0], "--nproc", "2", "--quiet", "--",
                               *script[1:]], env, work))
        mb, mo = statistics.median(bare), statistics.median(ours)
        print(f"{name}: bare torchrun {mb:.1f} s, ddplab run {mo:.1f} s (median of {a.runs}): {mo / mb:.2f}x "
              f"[bare {', '.join(f'{x:.1f}' for x in bare)}; ddplab {', '.join(f'{x:.1f}' for x in ours)}]",
              flush=True)


if __name__ == "__main__":
    main()
