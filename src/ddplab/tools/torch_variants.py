"""A set of lab variants run on this venv's torch (``make test-torch VERSION=x`` runs it after the
engine's tests): each must end as its catalog entry expects. One line per variant, then the torch
version and how many held; exit 1 when one did not.

    python -m ddplab.tools.torch_variants [--json]
"""
from __future__ import annotations

import json
import sys

# one of each kind the engine judges: a hang, a crash with a known cause, an init failure, a clean
# run, a --check finding (lab 12), a failure read from the flight recorder's ledger
VARIANTS = (("01", "broken", False), ("01", "fixed-sampler", False), ("03", "gather-ragged", False),
            ("06", "missing-rank", False), ("10", "eval-rank0", False), ("12", "no-set-epoch", True))


def main(argv: list[str] | None = None) -> int:
    import torch

    import ddplab
    from ddplab.origins import catalog

    rows = []
    for lab, variant, check in VARIANTS:
        expected = catalog.find_lab(lab).variant(variant)
        r = ddplab.run(lab, variant=variant, check=check, progress=None)
        held = r.status == expected.expect and r.signature == expected.signature
        if check:
            held = held and r.check is not None and bool(r.check.findings)
        rows.append({"lab": lab, "variant": variant, "expected": [expected.expect, expected.signature],
                     "got": [str(r.status), r.signature], "held": held, "notes": list(r.notes)})
        print(f"{lab} {variant}: expected {expected.expect} [{expected.signature}], got {r.status} "
              f"[{r.signature}]: {'held' if held else 'DIFFERS'}", flush=True)
    n = sum(r["held"] for r in rows)
    print(f"torch {torch.__version__}: {n}/{len(rows)} lab variants ended as their catalog entries expect")
    if argv and "--json" in argv:
        print(json.dumps({"torch": torch.__version__, "variants": rows}, indent=2))
    return 0 if n == len(rows) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
