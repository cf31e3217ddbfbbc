"""Turns on a shared machine: a run whose numbers are measured times has the machine alone.

``make workbook`` executes notebooks side by side and names a folder in DDPLAB_MACHINE_LOCK for
them. Every run then takes a turn around its job: a shared turn, or, for a variant the catalog
marks ``measured`` (its verdicts compare step times, samples/s, rounds), the machine alone. A run
that wants the machine alone waits until the runs in progress have ended, and no other run starts
until it has ended; it holds the turnstile while it waits, so runs that only share cannot starve
it. Other work in a notebook (a plot, a kernel starting) is not stopped, and is small.

With DDPLAB_MACHINE_LOCK unset (a learner's notebook, a test, ``ddplab run``) nothing is locked.
The locks are flock(2) locks on two files: the kernel drops them when the process ends, however it
ends, so a killed notebook never leaves the machine locked.
"""
from __future__ import annotations

import os
from contextlib import contextmanager

ENV = "DDPLAB_MACHINE_LOCK"


@contextmanager
def turn(alone: bool):
    """Hold a turn on the machine for the block: alone, or shared with other shared turns."""
    folder = os.environ.get(ENV)
    if not folder:
        yield
        return
    import fcntl

    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "turnstile"), "a") as gate, open(os.path.join(folder, "machine"), "a") as machine:
        fcntl.flock(gate, fcntl.LOCK_EX)
        try:
            fcntl.flock(machine, fcntl.LOCK_EX if alone else fcntl.LOCK_SH)
        except BaseException:
            fcntl.flock(gate, fcntl.LOCK_UN)
            raise
        if not alone:
            fcntl.flock(gate, fcntl.LOCK_UN)      # let the next one in; an alone run waiting holds it
        try:
            yield
        finally:
            fcntl.flock(machine, fcntl.LOCK_UN)
            if alone:
                fcntl.flock(gate, fcntl.LOCK_UN)
