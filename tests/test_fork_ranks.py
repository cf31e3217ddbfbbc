"""ddplab.origins.zygote for real: a lab's ranks are forked from a process that imported torch. To the
script, a forked rank must be what torchrun's fresh ``python -u script.py`` is (argv, path, streams,
signals, session, seeds, threads, the hook's records, how it fails and exits); the one difference the
module documents (one string-hash seed for every rank) is checked to be what it says."""
import dataclasses
import json
import textwrap
from pathlib import Path

import pytest

import ddplab
from ddplab.defaults import GRACE_S
from ddplab.origins import job as jobs
from ddplab.origins import catalog, launch, warm, zygote
from conftest import assert_nothing_left

pytestmark = pytest.mark.skipif(not (warm.enabled() and zygote.enabled()),
                                reason="forked ranks need warm agents: Linux only")

PROBE = textwrap.dedent('''\
    import atexit, io, json, os, random, signal, sys, warnings
    import numpy, torch, torch.nn.parallel, torch._dynamo   # what DDP's __init__ imports
    out, rank = os.environ["PROBE_OUT"], os.environ["RANK"]
    rec = {
        "name": __name__, "file": __file__, "argv": sys.argv, "path0": sys.path[0],
        "pythonpath_next": sys.path[1] == os.environ["PYTHONPATH"].split(os.pathsep)[0],
        "main_is_globals": sys.modules["__main__"].__dict__ is globals(),
        "cwd": os.getcwd(), "own_session": os.getsid(0) == os.getpid(),
        "parent_is_torchrun": "_torchrun" in open(f"/proc/{os.getppid()}/cmdline").read(),
        "threads": torch.get_num_threads(), "omp": os.environ.get("OMP_NUM_THREADS"),
        "sigint": signal.getsignal(signal.SIGINT) is signal.default_int_handler,
        "sigterm": str(signal.getsignal(signal.SIGTERM)), "sigpipe": str(signal.getsignal(signal.SIGPIPE)),
        "stdout_write_through": sys.stdout.write_through, "stderr_errors": sys.stderr.errors,
        "stdout_is_file": os.path.realpath("/proc/self/fd/1").endswith("stdout.log"),
        "stdin": os.path.realpath("/proc/self/fd/0"),
        "warning_filters": [f[0] + ":" + f[2].__name__ for f in warnings.filters],
        "excepthook_is_the_hooks": sys.excepthook is not sys.__excepthook__,
        "np": numpy.random.rand(), "py": random.random(), "hash": hash("ddplab"),
    }
    with open(os.path.join(out, rank + ".json"), "w") as f:
        json.dump(rec, f)
    atexit.register(lambda: open(os.path.join(out, rank + ".atexit"), "w").write("ran"))
    kept = open(os.path.join(out, rank + ".unclosed"), "w")   # never closed: the interpreter's exit flushes it
    kept.write("flushed at exit")
    print("unbuffered", rank)
    end = os.environ.get("PROBE_END")
    if end == "raise":
        def inner():
            raise ValueError("probe failed on purpose")
        inner()
    if end == "exit3":
        sys.exit(3)
''')


def _run(tmp_path: Path, fork: bool, end: str = "") -> tuple:
    script = tmp_path / "probe.py"
    script.write_text(PROBE)
    out = tmp_path / ("forked" if fork else "fresh") / end
    out.mkdir(parents=True)
    job = jobs.resolve(script, None, 2, None, env={"PROBE_OUT": str(out), "PROBE_END": end},
                       run_root=tmp_path / "runs")
    result = launch._turn(dataclasses.replace(job, fork_ranks=fork), False, GRACE_S, None, None)
    assert result.leftover == ()
    assert_nothing_left(str(result.run_dir))
    return result, out


def _records(out: Path) -> dict:
    return {r: json.loads((out / f"{r}.json").read_text()) for r in ("0", "1")}


def _info(result, rank: int) -> dict:
    return json.loads((Path(result.run_dir) / "ranks" / f"rank{rank}.json").read_text())


def test_a_forked_rank_is_what_torchruns_fresh_process_is(tmp_path):
    fresh, fresh_out = _run(tmp_path, fork=False)
    forked, forked_out = _run(tmp_path, fork=True)
    assert fresh.status == forked.status == "ok"
    assert [_info(fresh, r)["forked_from"] for r in (0, 1)] == [None, None]
    zygotes = {_info(forked, r)["forked_from"] for r in (0, 1)}
    assert len(zygotes) == 1 and None not in zygotes           # both ranks from the run's one zygote
    a, b = _records(fresh_out), _records(forked_out)
    for r in ("0", "1"):
        for key in a[r]:
            if key in ("np", "py", "hash"):
                continue
            assert a[r][key] == b[r][key], (r, key, a[r][key], b[r][key])
        for out in (fresh_out, forked_out):
            assert (out / f"{r}.atexit").read_text() == "ran"
            assert (out / f"{r}.unclosed").read_text() == "flushed at exit"
    # each rank draws its own random numbers, forked or not
    for rec in (a, b):
        assert rec["0"]["np"] != rec["1"]["np"] and rec["0"]["py"] != rec["1"]["py"]
    # the documented difference: forked ranks share their parent's string-hash seed
    assert a["0"]["hash"] != a["1"]["hash"]
    assert b["0"]["hash"] == b["1"]["hash"]


@pytest.mark.parametrize("end,code", [("raise", 1), ("exit3", 3)])
def test_a_forked_rank_fails_as_a_fresh_one_does(tmp_path, end, code):
    fresh, _ = _run(tmp_path, fork=False, end=end)
    forked, _ = _run(tmp_path, fork=True, end=end)
    for r in (fresh, forked):
        assert (r.status, r.signature, r.returncode) == ("failed", fresh.signature, 1)
        failures = json.loads((Path(r.run_dir) / "torchrun.json").read_text())["failures"]
        codes = {f["exitcode"] for f in failures.values()}     # torchrun may end the other rank first (SIGTERM)
        assert code in codes and codes <= {code, -15}
    errors = [json.loads((Path(r.run_dir) / "ranks" / "rank0.error.json").read_text()) for r in (fresh, forked)]
    assert [e["type"] for e in errors] == [errors[0]["type"]] * 2
    # the traceback starts at the script, not in the zygote that ran it
    assert [f["file"] for f in errors[0]["frames"]] == [f["file"] for f in errors[1]["frames"]]
    logs = list(Path(forked.run_dir).rglob("stderr.log"))
    assert logs and not any("zygote" in p.read_text() for p in logs)


def test_a_lab_forks_its_ranks_and_a_users_script_does_not(tmp_path, monkeypatch):
    lab = ddplab.run("01", variant="fixed-sampler", run_root=tmp_path, progress=None)
    script = ddplab.run(Path(ddplab.__file__).parents[2] / "labs" / "01_hang.py", args=["--variant", "fixed-sampler"],
                        run_root=tmp_path, progress=None)
    monkeypatch.setenv(zygote.ENV, "0")
    off = ddplab.run("01", variant="fixed-sampler", run_root=tmp_path, progress=None)
    assert lab.status == script.status == off.status == "ok"
    assert _info(lab, 0)["forked_from"] is not None
    assert _info(script, 0)["forked_from"] is None and _info(off, 0)["forked_from"] is None
    for r in (lab, script, off):
        assert_nothing_left(str(r.run_dir))


def test_a_variant_whose_lesson_reads_the_start_up_gets_fresh_ranks(tmp_path):
    """Lab 01's exercise 2 counts a timeout from a hang that the ranks' start-up puts seconds after
    launch: its broken variant says so in its LAB entry, and resolve gives it fresh interpreters."""
    lab = catalog.find_lab("01")
    assert lab.variant("broken").fresh_ranks and not lab.variant("fixed-sampler").fresh_ranks
    assert not jobs.resolve("01", "broken", None, None, run_root=tmp_path).fork_ranks
    assert jobs.resolve("01", "fixed-sampler", None, None, run_root=tmp_path).fork_ranks
    assert not jobs.resolve(lab.path, None, 2, None, run_root=tmp_path).fork_ranks
