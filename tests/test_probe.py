"""ddplab.engine.probe against a real worker server (torch's, in another process): a request the
rank has not answered keeps its lock, so the rank can wait for it before it shuts the server down."""
import fcntl
import os
import subprocess
import sys
import textwrap

import pytest
from conftest import wait_until

from ddplab import runfiles
from ddplab.engine import probe

SERVER = textwrap.dedent("""
    import os, sys, time
    from torch._C import _distributed_c10d as c10d
    sock, release, lock = sys.argv[1], sys.argv[2], sys.argv[3]
    os.close(os.open(lock, os.O_RDWR | os.O_CREAT, 0o600))    # as the rank hook does, before its server
    server = c10d._WorkerServer(sock)
    def slow(req, resp):                      # answers once the test allows it
        while not os.path.exists(release):
            time.sleep(0.01)
        resp.set_content("answered", "text/plain")
        resp.set_status(200)
    c10d._register_handler("slow", slow)
    print("up", flush=True)
    sys.stdin.read()                          # until the test closes stdin
    os.unlink(sock)
    server.shutdown()
""")


def _locked_by_someone(path) -> bool:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return False
    except OSError:
        return True
    finally:
        os.close(fd)


@pytest.fixture
def server(tmp_path):
    sock, release = tmp_path / "r0.sock", tmp_path / "release"
    p = subprocess.Popen([sys.executable, "-c", SERVER, str(sock), str(release), runfiles.probe_lock(str(sock))],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        assert p.stdout.readline() == "up\n"
        yield str(sock), release
    finally:
        p.stdin.close()
        try:
            p.wait(timeout=30)
        finally:
            p.kill()


def test_an_unanswered_request_keeps_its_lock_until_the_rank_answers(server):
    sock, release = server
    lock = runfiles.probe_lock(sock)
    assert probe.ask(sock, "slow", timeout_s=0.2) is None          # the caller stops waiting
    assert _locked_by_someone(lock)                               # the request is still in flight
    assert probe.ask(sock, "slow", timeout_s=0.3) is None          # a second one waits for the first
    release.touch()
    wait_until(lambda: not _locked_by_someone(lock), "the reaper lets go once the rank has answered")
    assert probe.ask(sock, "slow", timeout_s=5.0) == b"answered"   # and the rank is asked again


def test_a_rank_that_is_exiting_is_not_asked(server):
    sock, release = server
    release.touch()
    assert probe.ask(sock, "slow", timeout_s=5.0) == b"answered"
    fd = os.open(runfiles.probe_lock(sock), os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)                              # what the rank hook does as it exits
        assert probe.ask(sock, "slow", timeout_s=5.0) is None
    finally:
        os.close(fd)
    assert probe.ask(sock, "slow", timeout_s=5.0) == b"answered"


def test_no_lock_file_is_ever_made_by_a_prober(server, tmp_path):
    # CI (at 91cd8f2): a prober re-created a gone rank's lock file while the launcher removed the folder
    sock, release = server
    release.touch()
    lock = runfiles.probe_lock(sock)
    os.unlink(lock)          # a server with no lock beside it: torch's own worker_main, asked without one
    assert probe.ask(sock, "slow", timeout_s=5.0) == b"answered"
    assert not os.path.exists(lock)
    gone = str(tmp_path / "gone.sock")                              # neither socket nor lock: not asked
    assert probe.ask(gone, "slow", timeout_s=1.0) is None
    assert not os.path.exists(runfiles.probe_lock(gone))
