"""What a rank was given: its environment, sys.path, argv, working folder, and whether the user's own
sitecustomize.py ran (tests/test_parity.py starts it under bare torchrun and under ddplab run).

    torchrun --nproc-per-node 2 parity_probe.py OUT_DIR
"""
import builtins
import json
import os
import sys


def main(out):
    rank = os.environ["RANK"]
    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump({"env": dict(os.environ), "path": sys.path, "argv": sys.argv, "cwd": os.getcwd(),
                   "user_sitecustomize": getattr(builtins, "_parity_user_sitecustomize", False)}, f)


if __name__ == "__main__":
    main(sys.argv[1])
