"""init_process_group pointed at an address nobody serves: the script overrides the MASTER_PORT
torchrun gave it (a leftover from a config file) with PORT.

    torchrun --nproc-per-node 2 tests/scripts/dead_port.py PORT [TIMEOUT_S]
"""
import datetime
import os
import sys

import torch.distributed as dist

os.environ["MASTER_PORT"] = sys.argv[1]
timeout = {"timeout": datetime.timedelta(seconds=float(sys.argv[2]))} if len(sys.argv) > 2 else {}
dist.init_process_group("gloo", **timeout)
print("never reached", flush=True)
