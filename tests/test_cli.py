"""The command line: one clear line and exit 2 for every user mistake; JSON for scripts."""
import json
import subprocess
import sys

import pytest

from ddplab import cli


def ddplab(*args, timeout=120):
    return subprocess.run([sys.executable, "-m", "ddplab.cli", *args], capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize("args,words", [
    (["run", "99"], "unknown lab '99'"),
    (["run", "01", "--variant", "nope"], "no variant 'nope'"),
    (["run", "01", "--nproc", "0"], "too few"),
    (["run", "01", "--nproc", "999"], "more ranks than this machine"),
    (["run", "01", "--nproc", "two"], "invalid int value"),
    (["run", "01", "--deadline", "0"], "more than 0 seconds"),
    (["run", "01", "--deadline", "-5"], "more than 0 seconds"),
    (["run", "01", "--stall", "0"], "--stall must be more than 0 seconds"),
    (["run", "01", "--stall", "-1"], "--stall must be more than 0 seconds"),
    (["attach", "999999999"], "no process with pid 999999999"),
    (["attach", "1", "--stall", "0"], "--stall must be more than 0 seconds"),
    (["attach", "notapid"], "invalid int value"),
    (["run", "nowhere/train.py"], "no such script"),
    (["run", "01", "--port", "70000"], "not a TCP port"),
    (["frobnicate"], "invalid choice"),
    (["list", "--", "x"], "only for `ddplab run`"),
])
def test_user_mistakes_are_one_line_and_exit_2(args, words):
    p = ddplab(*args)
    assert p.returncode == 2, p.stderr
    assert words in p.stderr
    assert "Traceback" not in p.stderr
    assert len(p.stderr.strip().splitlines()) == 1
    assert p.stdout == ""


def test_taken_port_names_the_holder():
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        p = ddplab("run", "01", "--port", str(port))
    import os
    assert p.returncode == 2
    assert f"port {port} is taken by pid {os.getpid()}" in p.stderr and "--port 0" in p.stderr


def test_list_json_matches_the_lab_scripts():
    p = ddplab("list", "--json")
    labs = json.loads(p.stdout)
    assert labs[0]["number"] == "01"
    assert [v["name"] for v in labs[0]["variants"]] == ["broken", "rank-conditional", "fixed-sampler", "fixed-join"]


def test_doctor_reports_every_check():
    p = ddplab("doctor", "--json", "--port", "0")
    report = json.loads(p.stdout)
    names = {i["name"] for i in report["items"]}
    assert {"torch", "gloo", "nccl / GPUs", "py-spy", "cores"} <= names
    assert report["facts"]["cores"] >= 1


@pytest.mark.multiprocess
@pytest.mark.timeout(120)
def test_run_json_for_scripts_and_ci(tmp_path):
    import os
    env = {**os.environ, "DDPLAB_RUNS_DIR": str(tmp_path)}
    p = subprocess.run([sys.executable, "-m", "ddplab.cli", "run", "01", "--variant", "fixed-sampler", "--json"],
                       capture_output=True, text=True, timeout=110, env=env)
    assert p.returncode == 0, p.stderr
    d = json.loads(p.stdout)
    assert d["status"] == "ok" and d["variant"] == "fixed-sampler" and len(d["ranks"]) == 2
    # the summary groups ranks by state: both exited cleanly, one group
    assert [(g["ranks"], g["state"], g["exit_code"]) for g in d["groups"]] == [("0-1", "exited", 0)]


def test_attach_to_a_process_that_is_not_a_job_says_what_it_is():
    import os
    p = ddplab("attach", str(os.getpid()))
    assert p.returncode == 2 and "Traceback" not in p.stderr
    assert f"pid {os.getpid()} is " in p.stderr and "not a torchrun job or one of its ranks" in p.stderr
    assert len(p.stderr.strip().splitlines()) == 1


def test_exit_codes_are_named():
    assert cli.STATUS_EXIT == {"ok": 0, "failed": 1, "hung": 3, "deadline": 4, "interrupted": 130,
                               "running": 0, "exited": 0}


@pytest.mark.multiprocess
@pytest.mark.timeout(120)
def test_status_line_on_a_terminal_only(tmp_path):
    """On a terminal, one status line rewritten in place (\\r) about once a second; the result on
    stdout stays clean."""
    import os
    import pty
    master, slave = pty.openpty()
    env = {**os.environ, "DDPLAB_RUNS_DIR": str(tmp_path)}
    p = subprocess.Popen([sys.executable, "-m", "ddplab.cli", "run", "01", "--variant", "fixed-sampler", "--quiet"],
                         stdout=subprocess.PIPE, stderr=slave, text=True, env=env)
    os.close(slave)
    seen = b""
    while True:
        try:
            chunk = os.read(master, 4096)
        except OSError:
            break
        if not chunk:
            break
        seen += chunk
    out, _ = p.communicate(timeout=100)
    os.close(master)
    assert p.returncode == 0
    lines = seen.decode(errors="replace").split("\r")
    # both ranks named, each alone or as one group in the same state ("ranks 0-1: running")
    assert any(("rank 0:" in l and "rank 1:" in l) or "ranks 0-1:" in l for l in lines), seen[-500:]
    assert "\r" not in out and out.startswith("01_hang --variant fixed-sampler: ok")
