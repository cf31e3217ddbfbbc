"""torch's debug-server dumps as an origin, for real: a job that never ran under ddplab (bare
torchrun, gloo) starts ``torch.distributed.debug.start_debug_server(dump_dir=..., dump_interval=1)``
and hangs because rank 1 skips a collective; once the dumps show the hang, every process of the job
is killed and ``ddplab.origins.explain([dump_dir])`` judges the job from the folder alone. Then the bad
input: a folder of unrelated files, the dumps without a stacks file, an empty or cut-short stacks
file (cut at every byte of the real one: an error or the same stacks, never other ones), and a dump
that lacks a rank's stack (rank 1 stopped with SIGSTOP before the job was killed).
"""
import importlib.util
import os
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from ddplab.origins import debugdump, explain
from ddplab.engine import groups
from ddplab.defaults import RankState
from ddplab.errors import DdplabError
from ddplab.result import Status
from conftest import assert_nothing_left, wait_until

SCRIPT = Path(__file__).parent / "scripts" / "debug_server_hang.py"
NPROC = 3
MISSING = [m for m in ("torch.distributed.debug", "jinja2", "tabulate", "requests")
           if importlib.util.find_spec(m) is None]
pytestmark = [pytest.mark.multiprocess,
              pytest.mark.skipif(bool(MISSING), reason=f"torch's debug server needs {', '.join(MISSING)}")]


def _line(marker: str) -> int:
    """The script's line holding ``marker`` (where a rank must be found waiting)."""
    return next(i for i, text in enumerate(SCRIPT.read_text().splitlines(), 1) if marker in text)


ALL_REDUCE = _line("dist.all_reduce(t)          # BROKEN")
BARRIER = _line("    dist.barrier()")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def _kill_tree(proc: subprocess.Popen) -> None:
    """torchrun, its workers (each in a session of its own) and rank 0's debug-server process."""
    try:
        tree = [psutil.Process(proc.pid)] + psutil.Process(proc.pid).children(recursive=True)
    except psutil.Error:
        tree = []
    for q in tree:
        try:
            q.kill()
        except psutil.Error:
            pass
    proc.wait(timeout=30)
    psutil.wait_procs(tree, timeout=10)


def _shows_the_hang(dumps: Path) -> bool:
    """A stacks dump was taken while every rank waited in its last collective, then another dump
    cycle began (so the folder holds several dumps, of more than one handler)."""
    if not dumps.is_dir():
        return False
    hung = [p.name for p in dumps.glob("stacks_*.txt")
            if (text := p.read_text(errors="replace")).count(f"line {ALL_REDUCE} in main") == NPROC - 1
            and f"line {BARRIER} in main" in text]
    return bool(hung) and any(p.name > min(hung) for p in dumps.glob("stacks_*.txt")) and any(
        not p.name.startswith("stacks_") for p in dumps.iterdir())


def _rank_pid(proc: subprocess.Popen, rank: int) -> int:
    for c in psutil.Process(proc.pid).children():
        env = c.environ()
        if env.get("RANK") == str(rank) and "LOCAL_RANK" in env:
            return c.pid
    raise AssertionError(f"no process of rank {rank}")


@pytest.fixture(scope="module")
def job(tmp_path_factory) -> tuple[Path, Path]:
    """(a copy of the dump_dir of the hung job, taken once a dump showed the hang; the dump_dir
    itself after rank 1 was stopped, SIGSTOP, and a dump went without its answer). Every process of
    the job is gone."""
    tmp = tmp_path_factory.mktemp("debugdump")
    folder, hung = tmp / "dumps", tmp / "hung"
    env = {k: v for k, v in os.environ.items() if not k.startswith("DDPLAB")}
    env.update(PYTHONPATH="", TORCH_FR_BUFFER_SIZE="200", OMP_NUM_THREADS="1")
    with open(tmp / "torchrun.log", "w") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(NPROC), "--rdzv-backend", "c10d",
             "--rdzv-endpoint", "127.0.0.1:0", str(SCRIPT), "--port", str(_free_port()), "--dump-dir", str(folder),
             "--dump-interval", "1", "--fetch-timeout", "2"], stdout=log, stderr=subprocess.STDOUT, env=env, cwd=tmp)
    try:
        wait_until(lambda: _shows_the_hang(folder) or proc.poll() is not None,
                   "a stacks dump of the hung job", limit_s=180, every_s=0.2)
        assert proc.poll() is None, (tmp / "torchrun.log").read_text()[-3000:]
        # every dump but the newest stacks file, which the dumper may be writing now
        newest = max(p.name for p in folder.glob("stacks_*.txt"))
        shutil.copytree(folder, hung, ignore=lambda _, names: [n for n in names if n == newest])
        os.kill(_rank_pid(proc, 1), signal.SIGSTOP)
        wait_until(lambda: any("PARTIAL DATA" in p.read_text(errors="replace") for p in folder.glob("stacks_*.txt")),
                   "a stacks dump without rank 1's answer", limit_s=180, every_s=0.2)
    finally:
        _kill_tree(proc)
    assert_nothing_left(str(folder))
    return hung, folder


@pytest.fixture(scope="module")
def dumps(job) -> Path:
    return job[0]


def test_explain_a_hang_from_the_debug_servers_dumps(dumps):
    names = {p.name.rsplit("_", 2)[0] for p in dumps.iterdir()}
    assert "stacks" in names and "fr_trace" not in names    # gloo on torch 2.13: its fr_trace dump fails
    assert isinstance(explain.source_for([dumps]), debugdump.DebugServerDumps)
    r = explain.explain([dumps])
    assert (r.status, r.signature, r.nproc) == (Status.HUNG, "hang-different-collectives", NPROC)
    assert r.stall is None and r.divergence is None         # no ledger in these dumps, no watch
    assert [x.state for x in r.ranks] == [RankState.HUNG] * NPROC
    assert [x.where.op for x in r.ranks] == ["all_reduce", "barrier", "all_reduce"]
    assert [(Path(x.where.frame.file), x.where.frame.line) for x in r.ranks] == [
        (SCRIPT, ALL_REDUCE), (SCRIPT, BARRIER), (SCRIPT, ALL_REDUCE)]
    assert {x.stack_source for x in r.ranks} == {debugdump.STACK_SOURCE}
    assert all(x.stack[-1].func == "<module>" for x in r.ranks)
    odd = groups.group(r)[0]
    assert odd.odd and odd.ranks == (1,)                   # the rank that skipped the all_reduce
    newest = max(p.name for p in dumps.glob("stacks_*.txt"))
    assert len(r.notes) == 1 and str(dumps) in r.notes[0] and newest in r.notes[0]
    assert not (dumps / "result.json").exists()            # a saved folder is read, never written


def test_bad_input(dumps, tmp_path):
    unrelated = tmp_path / "unrelated"
    unrelated.mkdir()
    (unrelated / "notes.txt").write_text("stacks\n")
    (unrelated / "stacks.txt").write_text("=== Rank 0: x ===\n")
    with pytest.raises(DdplabError, match="holds no evidence"):
        explain.explain([unrelated])

    no_stacks = tmp_path / "no_stacks"
    no_stacks.mkdir()
    for p in dumps.iterdir():
        if not p.name.startswith("stacks_"):
            shutil.copy(p, no_stacks)
    assert any(no_stacks.iterdir())
    with pytest.raises(DdplabError, match="no stacks_"):
        explain.explain([no_stacks])

    newest = max(dumps.glob("stacks_*.txt"))
    empty = tmp_path / "empty"
    shutil.copytree(dumps, empty)
    (empty / newest.name).write_text("")
    with pytest.raises(DdplabError, match=f"{newest.name} is not a whole") as e:
        explain.explain([empty])
    assert "\n" not in str(e.value)

    whole = debugdump.parse_stacks(newest)
    data = newest.read_bytes()
    cut = tmp_path / newest.name
    smaller = 0
    for n in range(len(data)):
        cut.write_bytes(data[:n])
        try:
            got = debugdump.parse_stacks(cut)
        except DdplabError as e:
            assert "\n" not in str(e)
            continue
        # Cut exactly between two ranks' answers: a smaller job, with the same stacks.
        assert got == {r: whole[r] for r in got} and len(got) < len(whole), n
        smaller += 1
    assert smaller <= 2 * (NPROC - 1)       # only at the blank line(s) between two ranks' answers


def test_a_rank_that_did_not_answer_is_not_judged_by_the_others(job):
    """Rank 1 stopped (SIGSTOP): the debug server's newest dump has no stack of it ('Error: 408'
    after the fetch timeout). Judging ranks 0 and 2 alone would say "all in the same collective"."""
    _, folder = job
    newest = max(folder.glob("stacks_*.txt"))
    assert "PARTIAL DATA" in newest.read_text()
    per_rank = debugdump.parse_stacks(newest)
    assert [r for r, (_, status) in per_rank.items() if status is not None] == [1]
    assert all(frames for r, (frames, _) in per_rank.items() if r != 1)
    with pytest.raises(DdplabError, match=r"holds no stack of rank 1 \(HTTP \d{3}\)") as e:
        explain.explain([folder])
    assert "\n" not in str(e.value)
