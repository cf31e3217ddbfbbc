"""The stall rule's evidence read from real processes: a runnable thread is progress owed (a rank
starved of a core on a loaded machine), a thread blocked on a lock or a sleep is not.

Each process touches a file (its first argument) once it has reached the state under test; the test
waits for that file, never for a length of time."""
import subprocess
import sys
import time

import psutil
from conftest import wait_until

from ddplab.engine.supervise import waiting_for_cpu

READY = "import sys; open(sys.argv[1], 'w').close()\n"
SPIN = READY + "while True: pass"
# the main thread blocks on a lock held forever: what a rank waiting on its peers looks like
BLOCKED = "import threading; l = threading.Lock(); l.acquire()\n" + READY + "l.acquire()"
# a rank waiting (in a sleep: the scenario, not a synchronisation) while its DataLoader worker decodes
CHILD_SPINS = ("import subprocess, sys, time\n"
               "subprocess.Popen([sys.executable, '-c', " + repr(SPIN) + ", sys.argv[1]])\n"
               "time.sleep(600)")


def _start(code, tmp_path):
    """The process, once it has touched its ready file (it has reached its loop, its lock, its child's loop)."""
    ready = tmp_path / "ready"
    p = subprocess.Popen([sys.executable, "-c", code, str(ready)])
    wait_until(ready.exists, "the process reached the state under test")
    return p


def _seen(p, n=20):
    """Sampled as the supervisor does (a sample every 20 ms); how many of n samples found a runnable thread."""
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


def test_a_spinning_process_is_runnable(tmp_path):
    p = _start(SPIN, tmp_path)
    try:
        assert _seen(p) >= 18
    finally:
        _stop(p)


def test_a_blocked_process_is_not(tmp_path):
    p = _start(BLOCKED, tmp_path)
    try:
        # from the ready file to the second acquire is a few bytecodes: wait until the kernel has it asleep
        wait_until(lambda: psutil.Process(p.pid).status() == psutil.STATUS_SLEEPING, "the main thread blocks on the lock")
        assert _seen(p) == 0
    finally:
        _stop(p)


def test_a_runnable_child_counts_for_its_rank(tmp_path):
    """A DataLoader worker decoding while the rank waits for its batch: the rank is not stuck."""
    p = _start(CHILD_SPINS, tmp_path)
    try:
        wait_until(lambda: psutil.Process(p.pid).status() == psutil.STATUS_SLEEPING, "the rank sleeps")
        assert psutil.Process(p.pid).children()
        assert _seen(p) >= 18
    finally:
        _stop(p)


def test_a_new_kernel_wait_is_progress_once_and_a_loop_of_known_waits_is_not():
    from ddplab.engine.supervise import new_wait
    seen = set()
    assert not new_wait(seen, None)                                   # running, or no /proc
    assert not new_wait(seen, "poll_schedule_timeout.constprop.0")    # the first wait: where it stopped
    assert not new_wait(seen, "poll_schedule_timeout")                # the same wait again
    assert new_wait(seen, "hrtimer_nanosleep")                        # it left it for another
    # a loop that polls and sleeps goes back and forth between waits already seen: no progress
    assert not any(new_wait(seen, w) for w in ["poll_schedule_timeout.isra.1", "hrtimer_nanosleep"] * 5)
