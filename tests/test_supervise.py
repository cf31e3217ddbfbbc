"""The stall rule's evidence read from real processes: a runnable thread is progress owed (a rank
starved of a core on a loaded machine), a thread blocked on a lock or a sleep is not."""
import subprocess
import sys
import time

import psutil

from ddplab.supervise import waiting_for_cpu

SPIN = "while True: pass"
# the main thread blocks on a lock held forever: what a rank waiting on its peers looks like
BLOCKED = "import threading; l = threading.Lock(); l.acquire(); l.acquire()"
CHILD_SPINS = ("import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', 'while True: pass']); "
               "time.sleep(600)")


def _start(code):
    p = subprocess.Popen([sys.executable, "-c", code])
    time.sleep(0.5)
    return p


def _seen(p, n=20):
    """Sampled as the supervisor does; how many of n samples found a runnable thread."""
    proc = psutil.Process(p.pid)
    hits = 0
    for _ in range(n):
        hits += waiting_for_cpu(proc)
        time.sleep(0.02)
    return hits


def _stop(p):
    for c in psutil.Process(p.pid).children(recursive=True):
        c.kill()
    p.kill()
    p.wait()


def test_a_spinning_process_is_runnable():
    p = _start(SPIN)
    try:
        assert _seen(p) >= 18
    finally:
        _stop(p)


def test_a_blocked_process_is_not():
    p = _start(BLOCKED)
    try:
        assert _seen(p) == 0
    finally:
        _stop(p)


def test_a_runnable_child_counts_for_its_rank():
    """A DataLoader worker decoding while the rank waits for its batch: the rank is not stuck."""
    p = _start(CHILD_SPINS)
    try:
        time.sleep(0.5)
        assert psutil.Process(p.pid).children()
        assert _seen(p) >= 18
    finally:
        _stop(p)
