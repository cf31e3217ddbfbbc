"""``%%ddplab``: a real IPython shell, real runs, and no process left behind."""
from __future__ import annotations

import os
import signal
import threading
from pathlib import Path

import pytest

from conftest import assert_nothing_left, job_processes, wait_until

OK_CELL = """\
import torch
import torch.distributed as dist
dist.init_process_group("gloo")
t = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(t)
print("sum", t.item())
dist.destroy_process_group()
"""

HANG_CELL = """\
import torch
import torch.distributed as dist
dist.init_process_group("gloo")
if dist.get_rank() == 0:
    dist.barrier()                 # rank 1 never comes
else:
    t = torch.ones(1)
    dist.all_reduce(t)
dist.destroy_process_group()
"""

BUSY_CELL = """\
import time
import torch
import torch.distributed as dist
dist.init_process_group("gloo")
while True:                        # computes for ever: only an interrupt ends it
    t = torch.ones(1)
    dist.all_reduce(t)
    time.sleep(0.01)
"""


@pytest.fixture(scope="module")
def shell():
    from IPython.core.interactiveshell import InteractiveShell
    sh = InteractiveShell.instance()
    sh.run_line_magic("load_ext", "ddplab")
    yield sh
    InteractiveShell.clear_instance()


def _cells_dir(session_runs_dir) -> Path:
    return Path(session_runs_dir) / "cells"


@pytest.mark.multiprocess
@pytest.mark.timeout(120)
def test_a_cell_runs_on_n_ranks_and_binds_its_result(shell, session_runs_dir, capsys):
    shell.run_cell_magic("ddplab", "--nproc 2 --name first", OK_CELL)
    r = shell.user_ns["first"]
    assert r is shell.user_ns["_ddplab"]
    assert r.status == "ok" and r.nproc == 2 and r.check is None
    assert [x.exit_code for x in r.ranks] == [0, 0]
    assert all("sum 3.0" in x.log_tail for x in r.ranks)
    # the cell is saved in the run folder, as it was written
    assert (Path(r.run_dir) / "script.py").read_text() == OK_CELL
    out = capsys.readouterr().out
    assert "ok" in out and r.run_dir.split("/")[-1] in out     # the verdict, shown in the cell output
    assert r.leftover == ()
    assert_nothing_left(str(session_runs_dir))


@pytest.mark.multiprocess
@pytest.mark.timeout(120)
def test_a_hang_is_judged_by_the_stall_rule_and_check_runs(shell, session_runs_dir):
    shell.run_cell_magic("ddplab", "--nproc 2 --stall 2 --check", HANG_CELL)
    r = shell.user_ns["_ddplab"]
    assert r.status == "hung" and r.stall is not None and r.stall.window_s == 2.0
    assert r.check is not None          # --check reached ddplab.run
    assert {x.state for x in r.ranks} == {"hung", "exited"} or {x.state for x in r.ranks} == {"hung"}
    assert r.leftover == ()
    assert_nothing_left(str(session_runs_dir))


@pytest.mark.parametrize("line, words", [
    ("--nproc 0", "too few"),
    ("--nproc", "needs a value"),
    ("--nproc two", "whole number"),
    ("--stall", "needs a value"),
    ("--frobnicate", "unknown option"),
    ("--name 1x", "variable name"),
    ("--check=yes", "no value"),
])
def test_bad_options_are_one_line_and_start_nothing(shell, session_runs_dir, capsys, line, words):
    shell.user_ns["_ddplab"] = "previous"
    before = set(_cells_dir(session_runs_dir).glob("*")) if _cells_dir(session_runs_dir).exists() else set()
    shell.run_cell_magic("ddplab", line, OK_CELL)
    err = capsys.readouterr().err.strip()
    assert words in err and len(err.splitlines()) == 1 and "Traceback" not in err
    assert shell.user_ns["_ddplab"] is None          # a refused cell leaves no stale result to grade
    after = set(_cells_dir(session_runs_dir).glob("*")) if _cells_dir(session_runs_dir).exists() else set()
    assert after == before                           # nothing written, nothing started
    assert not job_processes(str(session_runs_dir))


def test_a_syntax_error_names_its_line_and_starts_nothing(shell, session_runs_dir, capsys):
    before = set(_cells_dir(session_runs_dir).glob("*")) if _cells_dir(session_runs_dir).exists() else set()
    shell.run_cell_magic("ddplab", "--nproc 2 --name bad", "import torch\nx = (1,\nprint(x)\n")
    err = capsys.readouterr().err.strip()
    assert err.startswith("ddplab: SyntaxError") and "line 2" in err and len(err.splitlines()) == 1
    assert shell.user_ns["bad"] is None
    after = set(_cells_dir(session_runs_dir).glob("*")) if _cells_dir(session_runs_dir).exists() else set()
    assert after == before


@pytest.mark.multiprocess
@pytest.mark.timeout(180)
def test_a_kernel_interrupt_ends_the_job_and_the_shell_stays_usable(shell, session_runs_dir):
    # The interrupt arrives as a Jupyter kernel's does: SIGINT to the process running the cell, once
    # both ranks compute (their records of the job exist and each rank is alive).
    sent = threading.Event()

    def interrupt_when_running():
        wait_until(lambda: len([p for p in job_processes(str(session_runs_dir))
                                if "busy" in " ".join(p.info["cmdline"] or [])]) >= 2,
                   "both ranks of the busy cell run", limit_s=90, every_s=0.2)
        os.kill(os.getpid(), signal.SIGINT)
        sent.set()
        if not done.wait(60):     # evidence for a failure: what the main thread was doing meanwhile
            import sys
            import traceback
            main = sys._current_frames().get(threading.main_thread().ident)
            print(f"SIGINT sent 60 s ago, not seen; handler {signal.getsignal(signal.SIGINT)!r}, was "
                  f"{before!r}; the main thread:\n" + "".join(traceback.format_stack(main)), flush=True)

    # as ipykernel runs a cell: Python's own SIGINT handler (KeyboardInterrupt), whatever another test
    # of this process left
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    done = threading.Event()
    t = threading.Thread(target=interrupt_when_running, daemon=True)
    t.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            shell.run_cell_magic("ddplab", "--nproc 2 --name busy", BUSY_CELL)
    finally:
        done.set()
        signal.signal(signal.SIGINT, before)
    t.join()
    assert sent.is_set()
    r = shell.user_ns["busy"]
    assert r is not None and r.status == "interrupted" and r.leftover == ()
    assert (Path(r.run_dir) / "script.py").read_text() == BUSY_CELL
    assert_nothing_left(str(session_runs_dir))
    # the shell goes on: a plain cell and another ddplab cell both run
    assert shell.run_cell("1 + 1").result == 2
    shell.run_cell_magic("ddplab", "--nproc 2", OK_CELL)
    assert shell.user_ns["_ddplab"].status == "ok"
    assert_nothing_left(str(session_runs_dir))
