"""torchrun --nproc-per-node 2 dies_at_the_ending.py: a hang whose rank 1 outlives SIGTERM.

Rank 0 waits in a barrier, rank 1 in an all_reduce: different collectives, a hang. Rank 1's SIGTERM
handler does nothing (a training script that saves a checkpoint on SIGTERM defers it the same way),
so when the job is ended rank 0 dies first and rank 1's all_reduce raises gloo's "Connection closed
by peer": an error the ending caused, after the hang was seen.
"""
import signal

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
if dist.get_rank() == 0:
    dist.barrier()
else:
    signal.signal(signal.SIGTERM, lambda *_: None)
    dist.all_reduce(torch.ones(1))
