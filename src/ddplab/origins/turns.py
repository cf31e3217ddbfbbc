"""Turns on a shared machine: a run whose numbers are measured times has the machine alone.

``make workbook`` executes notebooks side by side and names a folder in DDPLAB_MACHINE_LOCK for
them. Every run then takes a turn around its job: a shared turn, or, for a variant the catalog
marks ``measured`` (its verdicts compare step times, samples/s, rounds), the machine alone. A run
that wants the machine alone waits until the runs in progress have ended, and no other run starts
until it has ended; it holds the turnstile while it waits, so runs that only share cannot starve
it. Other work in a notebook (a plot, a kernel starting) is not stopped, and is small.

An alone turn is taken early by the launcher: it holds the turnstile at once and starts the job,
whose processes start (torchrun's agent, each rank's ``import torch``) while the runs in progress
end; the ranks wait in ``ddplab.rank.lab``'s import for a file the launcher creates once the machine is
the run's (GO_ENV), so nothing is timed before. Started late, a measured run's start-up (3-4 s of
imports) had the machine alone and the runs it waited for ended on a machine half idle.

``judged_by_status()``: runs in the block share the machine whatever their variant measures (the
build's runs of variants no notebook showed are judged by status and signature only).

With DDPLAB_MACHINE_LOCK unset (a learner's notebook, a test, ``ddplab run``) nothing is locked.
The locks are flock(2) locks on two files: the kernel drops them when the process ends, however it
ends, so a killed notebook never leaves the machine locked.
"""
from __future__ import annotations

import os
import time
from contextlib import contextmanager

ENV = "DDPLAB_MACHINE_LOCK"
GO_ENV = "DDPLAB_MACHINE_GO"          # set on a job's ranks: "<file> <launcher pid>"
_status_only = False


class Turn:
    """A turn taken. ``ready()``: whether the machine is the run's as asked (at once for a shared
    turn or without a lock; for an early alone turn, once the runs in progress have ended)."""

    def __init__(self, machine=None):
        self._machine, self._granted = machine, machine is None

    def ready(self) -> bool:
        if not self._granted:
            import fcntl
            try:
                fcntl.flock(self._machine, fcntl.LOCK_EX | fcntl.LOCK_NB)
                self._granted = True
            except BlockingIOError:
                pass
        return self._granted

    def wait(self) -> None:
        """Block (in the kernel's lock wait) until the machine is this turn's."""
        if not self._granted:
            import fcntl
            fcntl.flock(self._machine, fcntl.LOCK_EX)
            self._granted = True


@contextmanager
def judged_by_status():
    """Runs started in this block take shared turns, whatever their variant measures."""
    global _status_only
    before, _status_only = _status_only, True
    try:
        yield
    finally:
        _status_only = before


def wait_for_go() -> None:
    """In a rank (``ddplab.rank.lab`` calls it at import, after ``import torch``, before anything is
    timed): wait until the launcher has the machine alone for this run. If the launcher is gone,
    leave with a one-line reason rather than wait for ever."""
    spec = os.environ.get(GO_ENV)
    if not spec:
        return
    path, _, pid = spec.rpartition(" ")
    checked = 0.0
    while not os.path.exists(path):
        time.sleep(0.02)
        checked += 0.02
        if checked >= 0.5:
            checked = 0.0
            try:
                os.kill(int(pid), 0)
            except ProcessLookupError:
                raise SystemExit(f"ddplab: the launcher (pid {pid}) that was to give this run the machine is gone")
            except (PermissionError, ValueError):
                pass


@contextmanager
def turn(alone: bool, early: bool = False):
    """Hold a turn on the machine for the block: alone, or shared with other shared turns; yields a
    Turn. ``early`` (alone only): hold the turnstile and return at once; ``Turn.ready()`` says when
    the machine is this turn's."""
    folder = os.environ.get(ENV)
    if not folder:
        yield Turn()
        return
    import fcntl

    alone = alone and not _status_only
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "turnstile"), "a") as gate, open(os.path.join(folder, "machine"), "a") as machine:
        fcntl.flock(gate, fcntl.LOCK_EX)
        if alone:                                 # holds the turnstile to the end: no run starts after it
            t = Turn(machine)
            try:
                if not early:
                    t.wait()
                yield t
            finally:
                if t._granted:
                    fcntl.flock(machine, fcntl.LOCK_UN)
                fcntl.flock(gate, fcntl.LOCK_UN)
            return
        try:
            fcntl.flock(machine, fcntl.LOCK_SH)
        finally:
            fcntl.flock(gate, fcntl.LOCK_UN)      # let the next one in; an alone run waiting holds it
        try:
            yield Turn()
        finally:
            fcntl.flock(machine, fcntl.LOCK_UN)
