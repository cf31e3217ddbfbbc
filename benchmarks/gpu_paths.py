"""The GPU paths, run where CUDA is (a lent GPU machine; this machine has none): what each run ended
as, beside what the catalog expects. Prints one JSON line per run and a closing count.

    PYTHONPATH=src python benchmarks/gpu_paths.py [--out DIR]

- NCCL: lab 01's fixed variant on one rank (NCCL on cuda:0; two ranks on one GPU take gloo, by design).
- CUDA OOM: lab 02's broken variant on one rank (the allocation fails on the GPU: cuda-oom).
- The wrong backend on a CUDA build: lab 06's wrong-backend (NCCL asked for, tensors on the CPU) and
  fixed-backend, two ranks.
- A GPU script's own mistakes on a CUDA build: tests/scripts' cpu_laptop.py ends ok where CUDA is.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RUNS = [
    ("01", "fixed", 1, {}),
    ("01", "broken", 2, {}),
    ("02", "broken", 1, {}),
    ("02", "fixed", 1, {}),
    ("06", "wrong-backend", 2, {}),
    ("06", "fixed-backend", 2, {}),
]


def main(out: Path) -> int:
    import torch

    import ddplab
    from ddplab.origins import catalog

    out.mkdir(parents=True, exist_ok=True)
    print(json.dumps({"torch": torch.__version__, "cuda": torch.cuda.is_available(),
                      "gpus": torch.cuda.device_count(),
                      "name": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None}), flush=True)
    rows = []
    for lab, variant, nproc, kw in RUNS:
        t = time.monotonic()
        r = ddplab.run(lab, variant=variant, nproc=nproc, run_root=out / "runs", progress=None, **kw)
        expected = catalog.find_lab(lab).variant(variant)
        row = {"lab": lab, "variant": variant, "nproc": nproc, "status": r.status.value, "signature": r.signature,
               "backend": next((x.get("backend") for x in r.records if x.get("backend")), None),
               "expected": [expected.expect, expected.signature], "seconds": round(time.monotonic() - t, 1),
               "headline": r.headline(), "leftover": list(r.leftover)}
        rows.append(row)
        print(json.dumps(row, default=str), flush=True)
    script = ROOT / "tests" / "scripts" / "cpu_laptop.py"
    if script.exists():
        r = ddplab.run(script, nproc=1, run_root=out / "runs", progress=None, stall_s=5)
        print(json.dumps({"script": script.name, "status": r.status.value, "signature": r.signature,
                          "headline": r.headline()}), flush=True)
    left = sum(1 for row in rows if row["leftover"])
    print(f"gpu paths: {len(rows)} runs, {left} left processes behind")
    return 0


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=ROOT / "build" / "gpu")
    sys.exit(main(p.parse_args().out))
