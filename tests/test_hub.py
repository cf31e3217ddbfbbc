"""The classroom through a real JupyterHub (classroom/jupyterhub_config.py, started as `make classroom` starts it):
K learners, each with their own Unix account, log in through the hub's API, get a server, open lab 01's notebook
through the Jupyter server's API and run it in a kernel over its websocket, as JupyterLab does: the broken run,
then the fix-it with one wrong and one right attempt, all K at the same moment.

Measured (written to build/classroom-hub.json, quoted in docs/instructor.md): every verdict right, each learner's
runs only in that learner's folder, no port clash, a learner's interrupt and kernel restart touching no other
learner's process, nothing left running after Ctrl-C to the launcher, each learner's seconds to a grade and the
peak memory. Needs root (accounts), JupyterHub and configurable-http-proxy: skips with the line that installs
what is missing.
"""
from __future__ import annotations

import json
import os
import statistics
import threading
import time
from pathlib import Path

import pytest

from ddplab.tools import hub as hubtool

import hubclient

ROOT = Path(__file__).resolve().parents[1]
K = int(os.environ.get("DDPLAB_HUB_LEARNERS", "4"))
PREFIX = "ddpk"                          # this test's learner accounts (removed afterwards)
NOTEBOOK = "01_hang.ipynb"
# lab 01's cells by id, as the served notebook has them (tests/test_assign.py keeps the ids stable)
PARAMS, IMPORTS, BROKEN, LOAD, FIX, GRADE = "e967e77a", "611a371f", "635c63bf", "b4641e92", "cdea99e0", "e79a21ba"
SPIN = """%%ddplab --nproc 2 --stall 900 --name spin
import time
import torch.distributed as dist
dist.init_process_group("gloo")
while True:                      # waits for ever: only an interrupt or a restart ends it
    time.sleep(0.1)
"""
NEEDS = hubtool.needs()

pytestmark = [pytest.mark.timeout(1200)]
needs_hub = pytest.mark.skipif(bool(NEEDS), reason=f"the classroom hub {'; '.join(map(str, NEEDS))}")


def _attempts(cell: str) -> tuple[str, str]:
    """The fix-it cell as a learner edits it: one wrong attempt (a barrier in the loop, which still hangs) and
    the right one (the exercise's reference, typed under the cell's own magic line)."""
    from ddplab.course import fixit
    magic = cell.split("\n", 1)[0]
    stop = "    if loss.item() < 0.05:"
    assert stop in cell, "lab 01's fix-it cell changed: update this test's wrong attempt"
    wrong = cell.replace(stop, "    dist.barrier()\n" + stop, 1)
    return wrong, magic + "\n" + fixit.get("01").reference


class Memory(threading.Thread):
    """Every 0.5 s, each learner's resident memory (every process of their account); the peaks."""

    def __init__(self, uids: list[int]):
        super().__init__(daemon=True)
        self.uids, self.peak_each, self.peak_all = uids, dict.fromkeys(uids, 0), 0
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            now = dict.fromkeys(self.uids, 0)
            for uid in self.uids:
                for p in hubclient.processes_of(uid):
                    try:
                        now[uid] += p.memory_info().rss
                    except Exception:
                        pass
                self.peak_each[uid] = max(self.peak_each[uid], now[uid])
            self.peak_all = max(self.peak_all, sum(now.values()))
            self.done.wait(0.5)


def _learner_round(learner: hubclient.Learner, cells: dict, start: threading.Barrier, out: dict) -> None:
    """One learner's session: the broken run, a wrong fix-it attempt and its grade, the right one and its grade."""
    r = out[learner.name] = {"verdicts": {}, "run_dirs": [], "ports": {}}
    wrong, right = _attempts(cells[FIX])
    for cid in (PARAMS, IMPORTS, LOAD):
        assert learner.execute(cells[cid])["status"] == "ok", (learner.name, cid)
    start.wait()
    t0 = time.monotonic()
    assert learner.execute(cells[BROKEN])["status"] == "ok"
    broken = learner.value('{"status": str(broken.status), "signature": broken.signature, '
                           '"run_dir": broken.run_dir, "port": broken.port, "leftover": list(broken.leftover)}')
    r["broken"] = broken
    for name, source in (("wrong", wrong), ("right", right)):
        t = time.monotonic()
        assert learner.execute(source)["status"] == "ok", (learner.name, name)
        shown = learner.execute(cells[GRADE])
        assert shown["status"] == "ok" and shown["outputs"], (learner.name, name, shown)
        r[name] = learner.value('{"passed": _.passed, "outcome": str(_.outcome), "run_dir": fix01.run_dir, '
                                '"port": fix01.port}')
        r[name]["seconds"] = time.monotonic() - t
    r["sequence_s"] = time.monotonic() - t0


@pytest.mark.multiprocess
@needs_hub
def test_k_learners_through_the_hub(tmp_path):
    from ddplab.origins import catalog
    state = tmp_path / "hub"
    names = [f"{PREFIX}{i}" for i in range(1, K + 1)]
    proc = hubclient.start_hub(K, PREFIX, state, tmp_path / "launcher.log")
    learners: list[hubclient.Learner] = []
    memory = None
    try:
        hub = hubtool.Hub.load(state)
        assert hub.url.startswith("http://127.0.0.1:"), hub.url          # loopback unless told otherwise
        learners = [hubclient.Learner(hub.url, a.name, a.uid, a.home) for a in hub.learners]
        assert [x.name for x in learners] == names
        # every learner logs in and gets a server at once
        for x in learners:
            x.log_in(hub.api_token)
        memory = Memory([x.uid for x in learners])
        memory.start()
        starts: dict = {}
        threads = [threading.Thread(target=lambda x=x: starts.__setitem__(x.name, x.start_server())) for x in learners]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert sorted(starts) == names
        # each server runs as its learner, with the environment instructor.md asks for, on its own port
        servers = {}
        for x in learners:
            found = [p for p in hubclient.processes_of(x.uid)
                     if any("jupyterhub-singleuser" in a for a in (p.info["cmdline"] or []))]
            assert len(found) == 1, (x.name, found)
            env = hubclient.env_of(found[0])
            assert env.get("OMP_NUM_THREADS") == "1" and env.get("DDPLAB_RUNS_DIR") == f"{x.home}/{hubtool.RUNS_DIR}"
            assert "MASTER_PORT" not in env and env.get("HOME") == x.home
            servers[x.name] = {c.laddr.port for c in found[0].net_connections("tcp") if c.status == "LISTEN"}
        ports = [p for s in servers.values() for p in s]
        assert len(ports) == len(set(ports)) >= K, servers                # no two servers on one port

        # lab 01's notebook, as each learner's server serves it; a kernel and its websocket each
        cells = {}
        for x in learners:
            nb = x.notebook(f"{NOTEBOOK}")
            cells = {c["id"]: c["source"] for c in nb["cells"] if c["cell_type"] == "code"}
            x.open_kernel(NOTEBOOK)
        # every learner runs the broken run and the fix-it's two attempts at the same moment
        results: dict = {}
        errors: list = []
        barrier = threading.Barrier(K)

        def one(x):
            try:
                _learner_round(x, cells, barrier, results)
            except BaseException as e:       # the assertion below names the learner and what failed
                errors.append((x.name, repr(e)))
                barrier.abort()
        threads = [threading.Thread(target=one, args=(x,)) for x in learners]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors, errors

        expect = catalog.find_lab("01").variant("broken")
        verdicts = {x.name: [results[x.name]["broken"]["status"] == expect.expect
                             and results[x.name]["broken"]["signature"] == expect.signature,
                             results[x.name]["wrong"]["passed"] is False,
                             results[x.name]["right"]["passed"] is True] for x in learners}
        right = sum(sum(v) for v in verdicts.values())
        assert right == 3 * K, {n: (v, results[n]) for n, v in verdicts.items()}
        # each learner's runs only in that learner's folder, and that folder only theirs
        for x in learners:
            mine = Path(x.home) / hubtool.RUNS_DIR
            r = results[x.name]
            for run in (r["broken"]["run_dir"], r["wrong"]["run_dir"], r["right"]["run_dir"]):
                assert Path(run).resolve().is_relative_to(mine), (x.name, run)
            assert not r["broken"]["leftover"]
            owners = {p.stat().st_uid for p in mine.rglob("*")}
            assert owners == {x.uid}, (x.name, owners)
        # no port clash: the K broken runs ran at the same moment, each on its own port
        broken_ports = [results[x.name]["broken"]["port"] for x in learners]
        assert None not in broken_ports and len(set(broken_ports)) == K, broken_ports

        # a learner's interrupt and kernel restart touch no other learner's process
        a, b = learners[0], learners[1]
        spin_a, spin_b = a.send(SPIN), b.send(SPIN)
        ranks = {x.name: _wait_for_ranks(x.uid, 2) for x in (a, b)}
        before = {x.name: {p.pid for p in hubclient.processes_of(x.uid)} for x in learners}
        a.interrupt()
        assert a.wait(spin_a)["error"] == "KeyboardInterrupt"
        _wait_gone(ranks[a.name])
        after = {x.name: {p.pid for p in hubclient.processes_of(x.uid)} for x in learners}
        for x in learners[1:]:
            assert before[x.name] <= after[x.name], (x.name, before[x.name] - after[x.name])
        assert all(p.is_running() for p in ranks[b.name])
        assert a.value('str(spin.status)') == "interrupted"      # the same kernel goes on
        b_kernel = hubclient.kernel_pid(b.uid)
        before = after
        b.close()
        b.restart()
        _wait_gone(ranks[b.name])
        after = {x.name: {p.pid for p in hubclient.processes_of(x.uid)} for x in learners}
        for x in [a, *learners[2:]]:
            assert before[x.name] <= after[x.name], (x.name, before[x.name] - after[x.name])
        assert b_kernel not in after[b.name]

        # the learner's notebook, saved with the right attempt (as JupyterLab's save does): the instructor
        # collects it (tests/test_gradebook.py grades collected notebooks)
        nb = a.notebook(NOTEBOOK)
        fix = next(c for c in nb["cells"] if c.get("id") == FIX)
        fix["source"] = _attempts(cells[FIX])[1]
        a.save(NOTEBOOK, nb)
        from ddplab.course import gradebook
        collected = gradebook.collect([x.home for x in learners], tmp_path / "collected")
        assert [(c.learner, c.exercise) for c in collected] == [(a.name, "01")]     # only a's was changed
    finally:
        for x in learners:
            x.close()
        if memory is not None:
            memory.done.set()
        code = hubclient.stop_hub(proc)
        launcher = (tmp_path / "launcher.log").read_text()
        left = [p for uid in [x.uid for x in learners] for p in hubclient.processes_of(uid)]
        hubclient.remove_accounts(names)

    # Ctrl-C: the launcher stopped the hub, every server, kernel and job: nothing of any learner is left
    assert code == 0, launcher[-2000:]
    assert not left, [(p.pid, p.info["cmdline"]) for p in left]
    assert "0 left" in launcher, launcher[-800:]

    seq = [results[x.name]["sequence_s"] for x in learners]
    grade = [results[x.name]["right"]["seconds"] for x in learners]
    figures = {"learners": K, "cores": os.cpu_count(), "verdicts_right": right, "verdicts": 3 * K,
               "server_start_s": {"median": round(statistics.median(starts.values()), 1),
                                  "worst": round(max(starts.values()), 1)},
               "time_to_grade_s": {"median": round(statistics.median(grade), 1), "worst": round(max(grade), 1)},
               "sequence_s": {"median": round(statistics.median(seq), 1), "worst": round(max(seq), 1)},
               "peak_learner_mb": max(memory.peak_each.values()) // 2**20, "peak_all_mb": memory.peak_all // 2**20,
               "load_avg": os.getloadavg()[0], "results": results}
    out = ROOT / "build" / "classroom-hub.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(figures, indent=2))
    print(json.dumps({k: v for k, v in figures.items() if k != "results"}))


def _wait_for_ranks(uid: int, n: int) -> list:
    """The learner's spinning job's ranks, once ``n`` run (its %%ddplab script is spin.py)."""
    end = time.monotonic() + hubclient.CELL_S
    while True:
        ranks = [p for p in hubclient.processes_of(uid) if any(a.endswith("spin.py") for a in (p.info["cmdline"] or []))]
        if len(ranks) >= n:
            return ranks
        assert time.monotonic() < end, f"uid {uid}: {len(ranks)} of {n} ranks running"
        time.sleep(0.2)


def _wait_gone(procs: list, wait_s: float = 60) -> None:
    end = time.monotonic() + wait_s
    while any(p.is_running() and p.status() != "zombie" for p in procs):
        assert time.monotonic() < end, [p.pid for p in procs if p.is_running()]
        time.sleep(0.1)


def test_a_head_count_past_the_machine_is_refused_with_its_figure(capsys):
    """Before any account or process: the one line names `ddplab classroom check`'s figure (here bounded by
    the cores, RANKS_PER_CORE_OK per core, so it does not move with the memory free at the moment)."""
    from ddplab import cli
    from ddplab.tools import classroom
    most = classroom.check(10_000, env={"OMP_NUM_THREADS": "1"}).facts["most_learners"]
    assert cli.main(["classroom", "hub", "--learners", "10000"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "10000 learners are more than this machine holds" in err, err
    assert f"at most {most} " in err and f"--learners {most}" in err, err


def test_a_missing_proxy_is_one_line_naming_its_install_command(monkeypatch):
    from ddplab.tools import system
    monkeypatch.setenv("DDPLAB_CONFIGURABLE_HTTP_PROXY", "/nonexistent/configurable-http-proxy")
    need = [n for n in hubtool.needs() if n.what == "configurable-http-proxy"]
    assert [str(n) for n in need] == [
        f"needs configurable-http-proxy: npm install --prefix {system.NPM_PREFIX} {system.NPM['configurable-http-proxy']}"]
