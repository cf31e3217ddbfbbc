"""ddplab.turns for real: processes that take turns on one machine (flock), as make workbook's
notebooks do. A run that wants the machine alone waits for the shared runs in progress, and a shared
run that comes after it waits for it (the turnstile), so it cannot be starved."""
import os
import subprocess
import sys
import time

import psutil
import pytest

from ddplab import turns

HOLDER = """
import os, sys, time
from pathlib import Path
from ddplab import turns
name, alone, folder = sys.argv[1], sys.argv[2] == "alone", Path(sys.argv[3])
(folder / f"{name}.trying").touch()
with turns.turn(alone=alone):
    (folder / f"{name}.in").touch()
    while not (folder / f"{name}.release").exists():
        time.sleep(0.01)
(folder / f"{name}.out").touch()
"""


def _start(name, kind, folder, lock):
    env = dict(os.environ, **{turns.ENV: str(lock)})
    return subprocess.Popen([sys.executable, "-c", HOLDER, name, kind, str(folder)], env=env)


def _until(cond, what, limit_s=60.0):
    end = time.monotonic() + limit_s
    while not cond():
        assert time.monotonic() < end, f"never: {what}"
        time.sleep(0.01)


def _blocked(proc, folder, name):
    """The holder has asked for its turn and sleeps in the kernel without having got it."""
    _until(lambda: (folder / f"{name}.trying").exists(), f"{name} asks")
    _until(lambda: psutil.Process(proc.pid).status() == psutil.STATUS_SLEEPING
           and "lock" in open(f"/proc/{proc.pid}/wchan").read(), f"{name} waits on a lock")
    return not (folder / f"{name}.in").exists()


@pytest.mark.skipif(not os.path.exists("/proc/self/wchan"), reason="reads the kernel's wait channel (Linux)")
def test_alone_waits_for_shared_and_shared_waits_behind_alone(tmp_path):
    lock = tmp_path / "turns"
    procs = []
    try:
        s1 = _start("s1", "shared", tmp_path, lock)
        procs.append(s1)
        _until(lambda: (tmp_path / "s1.in").exists(), "s1 gets a shared turn")
        s2 = _start("s2", "shared", tmp_path, lock)
        procs.append(s2)
        _until(lambda: (tmp_path / "s2.in").exists(), "s2 shares the machine with s1")
        (tmp_path / "s2.release").touch()
        a = _start("a", "alone", tmp_path, lock)
        procs.append(a)
        assert _blocked(a, tmp_path, "a")                      # s1 still runs
        s3 = _start("s3", "shared", tmp_path, lock)
        procs.append(s3)
        assert _blocked(s3, tmp_path, "s3")                    # behind a, although s1 only shares
        (tmp_path / "s1.release").touch()
        _until(lambda: (tmp_path / "a.in").exists(), "a gets the machine once s1 is out")
        assert (tmp_path / "s1.out").exists() and not (tmp_path / "s3.in").exists()
        (tmp_path / "a.release").touch()
        _until(lambda: (tmp_path / "s3.in").exists(), "s3 after a")
        assert (tmp_path / "a.out").exists()
        (tmp_path / "s3.release").touch()
        for p in procs:
            assert p.wait(timeout=30) == 0
    finally:
        for p in procs:
            p.kill()


def test_a_killed_holder_leaves_nothing_locked(tmp_path):
    lock = tmp_path / "turns"
    a = _start("a", "alone", tmp_path, lock)
    try:
        _until(lambda: (tmp_path / "a.in").exists(), "a gets the machine")
        a.kill()
        a.wait(timeout=30)
        b = _start("b", "alone", tmp_path, lock)
        _until(lambda: (tmp_path / "b.in").exists(), "b gets the machine after a was killed")
        (tmp_path / "b.release").touch()
        assert b.wait(timeout=30) == 0
    finally:
        a.kill()


def test_without_the_variable_nothing_is_locked(monkeypatch):
    monkeypatch.delenv(turns.ENV, raising=False)
    with turns.turn(alone=True), turns.turn(alone=True):     # no folder: a no-op, even nested
        pass
