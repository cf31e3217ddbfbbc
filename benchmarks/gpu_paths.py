"""The GPU paths, run where CUDA is (a lent GPU machine; this machine has none): what each run ended
as, beside what the catalog expects. Prints one JSON line per run and a closing count.

    PYTHONPATH=src python benchmarks/gpu_paths.py [--out DIR]

- Labs 01, 02 and 06 on two ranks (with fewer GPUs than ranks, ddplab.rank.lab takes gloo for all).
- The wrong backend on a CUDA build: lab 06's wrong-backend (NCCL asked for, tensors on the CPU).
- NCCL: benchmarks/gpu/nccl_allreduce.py on one rank, and on two ranks sharing one GPU (NCCL refuses).
- CUDA OOM: benchmarks/gpu/cuda_oom.py (a tensor twice the card, after NCCL started).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RUNS = [
    ("01", "broken", 2, {}),
    ("01", "fixed-sampler", 2, {}),
    ("02", "oom", 2, {}),
    ("06", "wrong-backend", 2, {}),
    ("06", "fixed-backend", 2, {}),
]
SCRIPTS = [("nccl_allreduce.py", 1), ("nccl_allreduce.py", 2), ("cuda_oom.py", 1)]


def main(out: Path) -> int:
    import torch

    import ddplab
    from ddplab.errors import DdplabError
    from ddplab.origins import catalog

    out.mkdir(parents=True, exist_ok=True)
    print(json.dumps({"torch": torch.__version__, "cuda": torch.cuda.is_available(),
                      "gpus": torch.cuda.device_count(),
                      "name": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None}), flush=True)
    rows = []
    todo = [(lab, v, n, catalog.find_lab(lab).variant(v)) for lab, v, n, _ in RUNS]
    todo += [(ROOT / "benchmarks" / "gpu" / s, None, n, None) for s, n in SCRIPTS]
    for target, variant, nproc, expected in todo:
        t = time.monotonic()
        try:
            r = ddplab.run(target, variant=variant, nproc=nproc, run_root=out / "runs", progress=None,
                           **({} if variant else {"stall_s": 10, "deadline_s": 120}))
        except DdplabError as e:
            print(json.dumps({"target": str(target), "variant": variant, "refused": str(e)}), flush=True)
            continue
        row = {"target": Path(str(target)).name, "variant": variant, "nproc": nproc, "status": r.status.value,
               "signature": r.signature, "expected": [expected.expect, expected.signature] if expected else None,
               "backend": next((x.get("backend") for x in r.records if x.get("backend")), None),
               "seconds": round(time.monotonic() - t, 1), "headline": r.headline(), "leftover": list(r.leftover)}
        rows.append(row)
        print(json.dumps(row, default=str), flush=True)
        if r.status.value != "ok":
            print(r.explain()[:1500], flush=True)
    left = sum(1 for row in rows if row["leftover"])
    print(f"gpu paths: {len(rows)} runs, {left} left processes behind")
    return 0


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=ROOT / "build" / "gpu")
    sys.exit(main(p.parse_args().out))
