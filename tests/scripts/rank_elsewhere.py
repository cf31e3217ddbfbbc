"""One rank is not in any collective: it waits for a connection nobody makes (--how socket), for
input on a pipe nobody writes (--how pipe) or sleeps (--how sleep), while its peer waits in all_reduce.

    torchrun --nproc-per-node 2 tests/scripts/rank_elsewhere.py --how socket
"""
import argparse
import os
import socket
import time

import torch
import torch.distributed as dist


def wait_for_input(how: str) -> None:
    if how == "socket":
        server = socket.socket()
        server.bind(("127.0.0.1", 0))
        server.listen()
        server.accept()                 # nobody connects
    elif how == "pipe":
        r, _w = os.pipe()
        os.read(r, 1)                   # nobody writes
    else:
        time.sleep(600)


def main(how: str) -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    dist.all_reduce(torch.ones(4))
    if rank == 1:
        wait_for_input(how)
    dist.all_reduce(torch.ones(4))


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--how", choices=["socket", "pipe", "sleep"], default="socket")
    main(p.parse_args().how)
