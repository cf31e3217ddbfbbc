"""ok-run wall time of real clients under `ddplab run` against bare torchrun, as ratios (issue 43).

    python benchmarks/client_overhead.py [--runs 3] [--imagenet PATH/TO/pytorch-examples/imagenet/main.py]

For each client (a PyTorch Lightning Trainer, an accelerate script: tests/scripts/clients/, mode ok;
pytorch/examples' imagenet main.py --dummy when its path is given and torchvision is installed): the
command's wall time as the user's clock sees it, `torchrun --nproc-per-node 2 script` against `ddplab run
script --nproc 2`, runs interleaved so both see the same machine (which one goes first alternates from run
to run); the median of each and their ratio. Each ddplab run's result.json is read afterwards: its status
and notes are printed, and a run that did not end ok stops the benchmark.

imagenet main.py as torchrun starts it on a CPU: env:// (torchrun's WORLD_SIZE and RANK), gloo, no
--multiprocessing-distributed (torchrun starts the processes), -j 0. Its --dummy sizes are fixed in the
source (FakeData of 1,281,167 training and 50,000 validation images), and no argument shortens an epoch.
Measured here on one thread (2 cores, load 5): FakeData 6 ms per image, resnet18's forward 128 ms per image,
mobilenet_v3_small's 14 ms: even --evaluate alone (25,000 validation images per rank) would take about 8
minutes a run with the smallest model, 55 with resnet18. So the benchmark runs a copy in
its own temporary folder with those two sizes set to IMAGENET_FAKE (64 and 32: 4 training steps and 2
validation steps per rank at -b 8, then the checkpoint every rank writes); the file given is not changed,
and nothing else in the copy differs. On a CPU main.py does not wrap the model in DDP (its CPU branch only
prints "using CPU, this will be slow"): the ranks' collectives are the rendezvous and validate()'s
all_reduce.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CLIENTS = ROOT / "tests" / "scripts" / "clients"
# imagenet main.py's --dummy FakeData sizes (training, validation) -> the copy's
IMAGENET_FAKE = {"FakeData(1281167,": "FakeData(64,", "FakeData(50000,": "FakeData(32,"}


def timed(cmd: list[str], env: dict, cwd: str) -> float:
    t0 = time.perf_counter()
    p = subprocess.run(cmd, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=900)
    dt = time.perf_counter() - t0
    if p.returncode:
        sys.exit(f"exit {p.returncode} after {dt:.1f} s: {' '.join(cmd)}\n"
                 f"{p.stdout.decode(errors='replace')[-4000:]}")
    return dt


def imagenet_copy(path: str, work: str) -> str:
    """A copy of imagenet main.py whose --dummy data sets have IMAGENET_FAKE's sizes (see the module's doc)."""
    src = Path(path).read_text()
    for old, new in IMAGENET_FAKE.items():
        if src.count(old) != 1:
            sys.exit(f"{path}: expected {old!r} once (pytorch/examples' imagenet/main.py --dummy), found it "
                     f"{src.count(old)} times: this main.py differs from the one the benchmark shortens; "
                     f"update IMAGENET_FAKE in {__file__}")
        src = src.replace(old, new)
    out = Path(work) / "imagenet" / "main.py"
    out.parent.mkdir()
    out.write_text(src)
    return str(out)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=3, help="runs of each launcher (default 3)")
    p.add_argument("--imagenet", help="pytorch/examples' imagenet/main.py (needs torchvision)")
    a = p.parse_args()
    work = tempfile.mkdtemp(prefix="ddplab-clients-")
    env = {**os.environ, "DDPLAB_RUNS_DIR": os.path.join(work, "runs")}
    print(f"runs in {work} (ddplab's run folders in runs/, the ranks' files; not removed)", flush=True)
    bindir = Path(sys.executable).parent
    jobs = {"lightning": [str(CLIENTS / "lightning_train.py"), "--mode", "ok"],
            "accelerate": [str(CLIENTS / "accelerate_train.py"), "--mode", "ok"]}
    if a.imagenet:
        jobs["imagenet --dummy"] = [imagenet_copy(a.imagenet, work), "--dummy", "-a", "resnet18", "--epochs", "1",
                                    "-b", "8", "-j", "0", "--dist-url", "env://", "--dist-backend", "gloo"]
    for name, script in jobs.items():
        runs_of = Path(env["DDPLAB_RUNS_DIR"]) / Path(script[0]).stem   # ddplab's run folders for this script
        bare, ours = [], []
        for i in range(a.runs):
            launch = {"bare": (bare, [str(bindir / "torchrun"), "--nproc-per-node", "2",
                                      "--master-port", str(29600 + i), *script]),
                      "ddplab": (ours, [str(bindir / "ddplab"), "run", script[0], "--nproc", "2", "--quiet", "--",
                                        *script[1:]])}
            for who in (("bare", "ddplab") if i % 2 == 0 else ("ddplab", "bare")):
                times, cmd = launch[who]
                times.append(timed(cmd, env, work))
        mine = [json.loads(f.read_text()) for f in sorted(runs_of.glob("*/result.json"))]
        states = [r["status"] + (f" notes {r['notes']}" if r["notes"] else "") for r in mine]
        mb, mo = statistics.median(bare), statistics.median(ours)
        print(f"{name}: bare torchrun {mb:.1f} s, ddplab run {mo:.1f} s (median of {a.runs}): {mo / mb:.2f}x "
              f"[bare {', '.join(f'{x:.1f}' for x in bare)}; ddplab {', '.join(f'{x:.1f}' for x in ours)}; "
              f"ddplab's results: {', '.join(states)}]", flush=True)
        if len(mine) != a.runs or any(r["status"] != "ok" for r in mine):
            sys.exit(f"{name}: expected {a.runs} ddplab runs ending ok in {runs_of}, found: {states}")

if __name__ == "__main__":
    main()
