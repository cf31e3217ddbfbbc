"""ddplab.origins.turns for real: processes that take turns on one machine (flock), as make workbook's
notebooks do. A run that wants the machine alone waits for the shared runs in progress, and a shared
run that comes after it waits for it (the turnstile), so it cannot be starved. A measured lab run
starts its job at once and its ranks wait for the machine before anything is timed."""
import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import psutil
import pytest

import ddplab
from ddplab.origins import turns
from conftest import wait_until

HOLDER = """
import os, sys, time
from pathlib import Path
from ddplab.origins import turns
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


def _blocked(proc, folder, name):
    """The holder has asked for its turn and sleeps in the kernel without having got it."""
    wait_until(lambda: (folder / f"{name}.trying").exists(), f"{name} asks")
    wait_until(lambda: psutil.Process(proc.pid).status() == psutil.STATUS_SLEEPING
           and "lock" in open(f"/proc/{proc.pid}/wchan").read(), f"{name} waits on a lock")
    return not (folder / f"{name}.in").exists()


@pytest.mark.skipif(not os.path.exists("/proc/self/wchan"), reason="reads the kernel's wait channel (Linux)")
def test_alone_waits_for_shared_and_shared_waits_behind_alone(tmp_path):
    lock = tmp_path / "turns"
    procs = []
    try:
        s1 = _start("s1", "shared", tmp_path, lock)
        procs.append(s1)
        wait_until(lambda: (tmp_path / "s1.in").exists(), "s1 gets a shared turn")
        s2 = _start("s2", "shared", tmp_path, lock)
        procs.append(s2)
        wait_until(lambda: (tmp_path / "s2.in").exists(), "s2 shares the machine with s1")
        (tmp_path / "s2.release").touch()
        a = _start("a", "alone", tmp_path, lock)
        procs.append(a)
        assert _blocked(a, tmp_path, "a")                      # s1 still runs
        s3 = _start("s3", "shared", tmp_path, lock)
        procs.append(s3)
        assert _blocked(s3, tmp_path, "s3")                    # behind a, although s1 only shares
        (tmp_path / "s1.release").touch()
        wait_until(lambda: (tmp_path / "a.in").exists(), "a gets the machine once s1 is out")
        assert (tmp_path / "s1.out").exists() and not (tmp_path / "s3.in").exists()
        (tmp_path / "a.release").touch()
        wait_until(lambda: (tmp_path / "s3.in").exists(), "s3 after a")
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
        wait_until(lambda: (tmp_path / "a.in").exists(), "a gets the machine")
        a.kill()
        a.wait(timeout=30)
        b = _start("b", "alone", tmp_path, lock)
        wait_until(lambda: (tmp_path / "b.in").exists(), "b gets the machine after a was killed")
        (tmp_path / "b.release").touch()
        assert b.wait(timeout=30) == 0
    finally:
        a.kill()


def _flocks_held_by(pid: int) -> list[str]:
    """This process's flock(2) locks, as the kernel lists them (/proc/locks: "1: FLOCK ADVISORY WRITE pid ...")."""
    return [ln for ln in Path("/proc/locks").read_text().splitlines()
            if ln.split()[1:2] == ["FLOCK"] and ln.split()[4:5] == [str(pid)]]


reads_lock_table = pytest.mark.skipif(not os.path.exists("/proc/locks"), reason="reads the kernel's lock table (Linux)")


@reads_lock_table
def test_without_the_variable_nothing_is_locked(monkeypatch, tmp_path):
    monkeypatch.delenv(turns.ENV, raising=False)
    monkeypatch.chdir(tmp_path)
    with turns.turn(alone=True) as outer, turns.turn(alone=True) as inner:     # no folder: a no-op, even nested
        assert outer.ready() and inner.ready()              # granted at once: an alone turn that waited would deadlock here
        assert _flocks_held_by(os.getpid()) == []           # the kernel holds no lock of this process
    assert not any(tmp_path.iterdir())                      # and no lock file was made


@reads_lock_table
def test_the_lock_table_shows_a_turn_that_is_held(monkeypatch, tmp_path):
    """The check above can fail: with the variable set, the same turn holds flock(2) locks."""
    monkeypatch.setenv(turns.ENV, str(tmp_path / "turns"))
    with turns.turn(alone=True):
        assert len(_flocks_held_by(os.getpid())) == 2        # the turnstile and the machine
    assert _flocks_held_by(os.getpid()) == []


def _rank_frames(run_dir: Path, rank: int) -> list[str]:
    """The functions on rank ``rank``'s main-thread stack, through its worker server (empty until it is up)."""
    from ddplab.engine import probe, stacks
    try:
        sock = json.loads((run_dir / "ranks" / f"rank{rank}.json").read_text())["socket"]
    except (OSError, ValueError, KeyError):
        return []
    text = probe.traceback(sock) if sock else None
    return [f.func for f in stacks.parse_faulthandler_main(text)] if text else []


@pytest.fixture
def shared_turn(tmp_path, monkeypatch):
    """make workbook's lock in this test process, and another process ("s1") in a shared turn until
    the test touches s1.release."""
    lock = tmp_path / "turns"
    monkeypatch.setenv(turns.ENV, str(lock))
    s1 = _start("s1", "shared", tmp_path, lock)
    try:
        wait_until(lambda: (tmp_path / "s1.in").exists(), "s1 gets a shared turn")
        yield s1
    finally:
        (tmp_path / "s1.release").touch()
        try:
            s1.wait(timeout=30)
        finally:
            s1.kill()


@pytest.mark.multiprocess
@pytest.mark.timeout(180)
def test_a_measured_run_starts_its_job_at_once_but_its_ranks_wait_for_the_machine(tmp_path, shared_turn):
    # make workbook: lab 07's link run measures all-reduce bandwidth. A shared turn is in progress,
    # so its job starts (agent, ranks, import torch) but no rank may get past ddplab.rank.lab's import
    # (where anything is timed) until the shared run has ended.
    box = {}
    runs = tmp_path / "runs"
    t = threading.Thread(target=lambda: box.update(r=ddplab.run("07", variant="link", run_root=runs, progress=None)))
    t.start()
    try:
        wait_until(lambda: any(runs.rglob("command.json")), "the measured job is started while s1 runs")
        d = next(runs.rglob("command.json")).parent
        for rank in (0, 1):
            wait_until(lambda: "wait_for_go" in _rank_frames(d, rank), f"rank {rank} waits for the machine", 120)
        records = d / "ranks" / "rank0.records.jsonl"
        assert not (d / "machine.go").exists() and not (records.exists() and records.read_text())
    finally:
        (tmp_path / "s1.release").touch()
        t.join(timeout=150)
    r = box["r"]
    assert r.status == "ok" and shared_turn.wait(timeout=30) == 0
    first = min(rec["t"] for k in r.ranks for rec in k.records)
    assert (d / "machine.go").stat().st_mtime <= first     # the machine was given, then the ranks began


@pytest.mark.multiprocess
@pytest.mark.timeout(180)
def test_a_run_judged_by_status_only_shares_the_machine(tmp_path, shared_turn):
    with turns.judged_by_status():
        r = ddplab.run("07", variant="link", run_root=tmp_path / "runs", progress=None)
    assert r.status == "ok" and not (Path(r.run_dir) / "machine.go").exists()
    assert shared_turn.poll() is None and not (tmp_path / "s1.out").exists()   # s1 was in its turn all along


def test_a_rank_whose_launcher_is_gone_stops_waiting(tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    env = dict(os.environ, **{turns.GO_ENV: f"{tmp_path / 'never'} {dead.pid}"})
    p = subprocess.run([sys.executable, "-c", "from ddplab.origins import turns; turns.wait_for_go()"], env=env,
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 1 and f"launcher (pid {dead.pid})" in p.stderr


def test_every_lab_with_a_measured_variant_imports_ddplab_lab_where_its_ranks_wait():
    # the early alone turn relies on it: a script that never imported ddplab.rank.lab would be timed on a
    # machine still shared with the runs in progress
    import ast
    from ddplab.origins import catalog

    measured = [lab for lab in catalog.labs() if any(v.measured for v in lab.variants)]
    assert {lab.number for lab in measured} >= {"07", "09", "10", "11"}
    for lab in measured:
        tree = catalog.parse(lab.path)
        imported = {a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module == "ddplab"
                    for a in n.names} | {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        assert "lab" in imported or "ddplab.rank.lab" in imported, f"{lab.path.name} does not import ddplab.rank.lab"
