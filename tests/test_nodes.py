"""Nodes merged, for real: `ddplab attach PID --save DIR` on each node of a hung job, then
`ddplab explain DIR DIR` names the node and rank where the collectives diverged first; torch's own
flight-recorder dumps of a job that never ran under ddplab; and the bad input (a folder that exists,
a folder with no evidence, two jobs, a cut-short dump).

The two-node job here is two torchrun agents on this machine (``--nnodes 2``, c10d rendezvous on
loopback), each a node with its own ranks; ``test_a_hang_across_namespaced_nodes`` does the same on
``ddplab.origins.cluster``'s namespaced nodes where the machine has the tools.
"""
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import pytest

from ddplab.origins import cluster
from ddplab import runfiles
from ddplab.origins.job import HOOK_DIR
from conftest import assert_nothing_left

SCRIPT = Path(__file__).parent / "scripts" / "hang_last_rank.py"
pytestmark = pytest.mark.multiprocess


def _ddplab(*args, env=None, timeout=180):
    return subprocess.run([sys.executable, "-m", "ddplab.cli", *args], capture_output=True, text=True,
                          timeout=timeout, env=env)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _kill_tree(procs):
    tree = []
    for p in procs:
        try:
            tree += [psutil.Process(p.pid)] + psutil.Process(p.pid).children(recursive=True)
        except psutil.Error:
            pass
    for q in tree:
        try:
            q.kill()
        except psutil.Error:
            pass
    for p in procs:
        p.wait(timeout=20)
    psutil.wait_procs(tree, timeout=10)


def _ranks_of(agent: subprocess.Popen) -> dict[int, int]:
    """rank -> pid of an agent's running workers."""
    out = {}
    for c in psutil.Process(agent.pid).children():
        try:
            env = c.environ()
        except psutil.Error:
            continue
        if "RANK" in env and "LOCAL_RANK" in env:
            out[int(env["RANK"])] = c.pid
    return out


@pytest.fixture
def two_node_hang(tmp_path):
    """A 4-rank job on two torchrun agents (2 ranks each) with ddplab's rank hook on the ranks' path
    (so their ledgers can be read), hung: ranks 0-2 in all_reduce #4, rank 3 in barrier #4."""
    port = _free_port()
    run_dir = tmp_path / "job"
    sockets = Path(tempfile.mkdtemp(prefix="ddplab-t-"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("DDPLAB")}
    env.update(PYTHONPATH=str(HOOK_DIR), DDPLAB_RUN_DIR=str(run_dir), DDPLAB_SOCKET_DIR=str(sockets),
               TORCH_FR_BUFFER_SIZE="2000", OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME="lo")
    agents, outputs = [], []
    try:
        for host in (1, 0):
            outputs.append(open(tmp_path / f"agent{host}.out", "wb"))
            agents.append(subprocess.Popen(
                [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "2",
                 "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-conf", f"is_host={host}",
                 "--rdzv-id", "nodes-test", "--local-addr", "127.0.0.1", str(SCRIPT)],
                # the ranks' output goes where the agent's goes: a file, as under a batch scheduler
                stdout=outputs[-1], stderr=subprocess.STDOUT, env=env, cwd=tmp_path,
                start_new_session=True))
        # every rank started and reached its worker server (the hook writes its socket's path)
        while not (len(_ranks_of(agents[0])) == 2 and len(_ranks_of(agents[1])) == 2
                   and len(list(sockets.glob("r*.sock"))) == 4):
            assert all(a.poll() is None for a in agents), "an agent exited before its ranks started"
            time.sleep(0.2)
        yield agents, tmp_path
    finally:
        _kill_tree(agents)
        for f in outputs:
            f.close()
        shutil.rmtree(sockets, ignore_errors=True)
        assert_nothing_left(str(run_dir))


@pytest.mark.timeout(300)
def test_attach_save_on_each_node_then_explain_names_node_and_rank(two_node_hang):
    agents, tmp = two_node_hang
    env = {**os.environ, "DDPLAB_RUNS_DIR": str(tmp / "runs")}
    folders = []
    for i, agent in enumerate(agents):
        folder = tmp / f"node{i}"
        p = _ddplab("attach", str(agent.pid), "--save", str(folder), "--node", f"n{i}", "--json", "--watch", "120",
                    env=env)
        assert p.returncode == 3, p.stderr
        assert json.loads(p.stdout)["status"] == "hung"
        folders.append(folder)
        node = json.loads((folder / runfiles.NODE).read_text())
        assert node["node"] == f"n{i}" and sorted(node["ranks"]) == sorted(_ranks_of(agent))
        assert node["job"]["WORLD_SIZE"] == "4" and node["job"]["TORCHELASTIC_RUN_ID"] == "nodes-test"
        for r in node["ranks"]:
            live = json.loads(Path(runfiles.rank_path(folder, r, runfiles.LIVE)).read_text())
            assert live["ledger"] and live["frames"]
            assert "three steps done" in Path(runfiles.rank_path(folder, r, runfiles.LOG)).read_text()
    # a folder that exists is refused before anything is watched: one line, exit 2
    p = _ddplab("attach", str(agents[0].pid), "--save", str(folders[0]), env=env)
    assert p.returncode == 2 and "already exists" in p.stderr and "--force" in p.stderr
    assert len(p.stderr.strip().splitlines()) == 1

    p = _ddplab("explain", *map(str, folders), "--json", env=env)
    assert p.returncode == 3, p.stderr
    d = json.loads(p.stdout)
    assert (d["status"], d["signature"], d["nproc"]) == ("hung", "hang-different-collectives", 4)
    node_of = {r: f"n{i}" for i, f in enumerate(folders)
               for r in json.loads((f / runfiles.NODE).read_text())["ranks"]}
    assert {r["rank"]: r["node"] for r in d["ranks"]} == {r: n + f" (node rank {_group(folders, n)})"
                                                          for r, n in node_of.items()}
    first = d["first_divergence"]
    assert first["seq"] == 4 and first["op"] == "barrier"
    assert first["ranks"] == [{"rank": 3, "node": d["ranks"][3]["node"]}]
    assert first["others"] == [{"op": "all_reduce", "ranks": [0, 1, 2]}]
    assert d["attached_pid"] == agents[0].pid
    text = _ddplab("explain", *map(str, folders), env=env).stdout
    assert f"node {d['ranks'][3]['node']}, rank 3: barrier" in text

    # the same folders twice, and folders of two jobs: one line naming the problem, exit 2
    p = _ddplab("explain", str(folders[0]), str(folders[0]), env=env)
    assert p.returncode == 2 and "in two folders" in p.stderr
    other = tmp / "other-job"
    shutil.copytree(folders[1], other)
    meta = json.loads((other / runfiles.NODE).read_text())
    meta["job"]["MASTER_PORT"] = str(int(meta["job"]["MASTER_PORT"]) + 1)
    (other / runfiles.NODE).write_text(json.dumps(meta))
    p = _ddplab("explain", str(folders[0]), str(other), env=env)
    assert p.returncode == 2 and "different jobs (MASTER_PORT" in p.stderr
    assert len(p.stderr.strip().splitlines()) == 1


def _group(folders, name):
    for f in folders:
        meta = json.loads((f / runfiles.NODE).read_text())
        if meta["node"] == name:
            return meta["group_rank"]


@pytest.mark.timeout(240)
def test_explain_reads_torchs_own_flight_recorder_dumps(tmp_path):
    """A job that never ran under ddplab: plain torchrun, gloo, a 3 s collective timeout, and each
    rank's dump written to $TORCH_FR_DUMP_TEMP_FILE<rank>."""
    dumps = tmp_path / "dumps"
    dumps.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("DDPLAB")}
    env.update(PYTHONPATH="", TORCH_FR_BUFFER_SIZE="200", TORCH_FR_DUMP_TEMP_FILE=str(dumps / "trace_"),
               OMP_NUM_THREADS="1")
    p = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "3", "--rdzv-backend",
                        "c10d", "--rdzv-endpoint", "127.0.0.1:0", str(SCRIPT), "--dump-after", "3"],
                       capture_output=True, text=True, env=env, cwd=tmp_path, timeout=180)
    assert p.returncode != 0 and sorted(f.name for f in dumps.iterdir()) == ["trace_0", "trace_1", "trace_2"]
    r = _ddplab("explain", str(dumps), "--json")
    assert r.returncode == 3, r.stderr
    d = json.loads(r.stdout)
    assert (d["status"], d["signature"]) == ("hung", "hang-different-collectives")
    assert [x["where"]["op"] for x in d["ranks"]] == ["all_reduce", "all_reduce", "barrier"]
    assert d["first_divergence"]["ranks"] == [{"rank": 2, "node": None}] and d["stall"] is None

    cut = tmp_path / "cut"
    shutil.copytree(dumps, cut)
    data = (cut / "trace_1").read_bytes()
    (cut / "trace_1").write_bytes(data[:len(data) // 2])
    r = _ddplab("explain", str(cut))
    assert r.returncode == 2 and "trace_1 is not a whole flight-recorder dump" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    empty = tmp_path / "empty"
    empty.mkdir()
    r = _ddplab("explain", str(empty))
    assert r.returncode == 2 and "holds no evidence" in r.stderr


@pytest.mark.skipif(cluster.requirement() is not None, reason=str(cluster.requirement()))
@pytest.mark.timeout(300)
def test_a_hang_across_namespaced_nodes(tmp_path):
    """Two ddplab.origins.cluster nodes (network namespaces), the job started the way a cluster starts it (one
    torchrun agent per node, no ddplab supervising), attached on each node, explained from the folders."""
    from ddplab.origins import job as job_mod
    from ddplab.origins.cluster import Cluster

    j = job_mod.resolve(Path(SCRIPT), None, 2, None, run_root=tmp_path, env={"GLOO_SOCKET_IFNAME": "eth0"})
    j.run_dir.mkdir(parents=True)
    (j.run_dir / runfiles.RANKS).mkdir()
    job_mod.socket_dir(j.run_dir).mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "DDPLAB_RUNS_DIR": str(tmp_path / "runs")}
    with Cluster(nodes=2) as c:
        cmd, penv, spec = job_mod.build_command(j, c)
        (j.run_dir / runfiles.CLUSTER).write_text(json.dumps(spec))
        parent = subprocess.Popen(cmd, env=penv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                  start_new_session=True)
        try:
            def agents():
                return [q for q in psutil.Process(parent.pid).children(recursive=True)
                        if "ddplab.origins._torchrun" in q.cmdline()[:4]]
            while len(list(job_mod.socket_dir(j.run_dir).glob("r*.sock"))) < 4:
                assert parent.poll() is None, "the job ended before its ranks started"
                time.sleep(0.2)
            folders = []
            for i, agent in enumerate(sorted(agents(), key=lambda q: q.pid)):
                folder = tmp_path / f"node{i}"
                p = _ddplab("attach", str(agent.pid), "--save", str(folder), "--node", f"n{i}", "--json",
                            "--watch", "120", env=env)
                assert p.returncode == 3, p.stderr
                folders.append(folder)
            p = _ddplab("explain", *map(str, folders), "--json", env=env)
            d = json.loads(p.stdout)
            assert (d["status"], d["signature"]) == ("hung", "hang-different-collectives")
            assert d["first_divergence"]["ranks"][0]["rank"] == 3 and d["first_divergence"]["ranks"][0]["node"]
        finally:
            _kill_tree([parent])
