"""Parity with bare torchrun: the same script started with ``torchrun --nproc-per-node 2`` and with
``ddplab run`` gets the same environment and sys.path in each rank, except for what
``ddplab.origins.parity`` lists; README's list is that list; a user's own sitecustomize.py runs
under both."""
import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

import ddplab
from ddplab.origins import parity
from conftest import assert_nothing_left

ROOT = Path(__file__).resolve().parents[1]
PROBE = Path(__file__).parent / "scripts" / "parity_probe.py"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ranks(folder: Path) -> dict[int, dict]:
    return {int(p.stem[4:]): json.loads(p.read_text()) for p in folder.glob("rank*.json")}


@pytest.mark.multiprocess
@pytest.mark.timeout(240)
def test_ranks_get_what_bare_torchrun_gives_except_the_listed_differences(tmp_path, monkeypatch):
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text("import builtins\nbuiltins._parity_user_sitecustomize = True\n")
    monkeypatch.setenv("PYTHONPATH", str(site))
    monkeypatch.chdir(tmp_path)
    bare, ours = tmp_path / "bare", tmp_path / "ours"
    bare.mkdir()
    ours.mkdir()
    torchrun = Path(sys.executable).with_name("torchrun")
    subprocess.run([str(torchrun), "--nproc-per-node", "2", "--master-port", str(_free_port()), str(PROBE), str(bare)],
                   check=True, capture_output=True, timeout=200)
    r = ddplab.run(PROBE, args=[str(ours)], nproc=2, run_root=tmp_path / "runs", progress=None)
    assert r.status == "ok", r.explain()
    assert_nothing_left(str(tmp_path / "runs"))
    b, o = _ranks(bare), _ranks(ours)
    assert sorted(b) == sorted(o) == [0, 1]
    allowed = parity.env_names(lab=False, check=False)
    listed_env = {v for d in parity.DIFFERENCES if d.kind == parity.Kind.ENV and d.when == parity.When.ALWAYS
                  for v in d.env}
    for rank in (0, 1):
        eb, eo = b[rank]["env"], o[rank]["env"]
        differ = {k for k in set(eb) | set(eo) if eb.get(k) != eo.get(k)}
        # the terminal's size: bare torchrun's ranks started from pytest here got COLUMNS=80 LINES=24,
        # which neither the test, torch nor ddplab sets and which bare torchrun started from a plain
        # Python process does not get; ddplab's ranks keep the caller's (unset)
        differ -= {k for k in ("COLUMNS", "LINES") if eo.get(k) == os.environ.get(k)}
        assert differ <= allowed, f"rank {rank}: not in ddplab.origins.parity: " + ", ".join(
            f"{k}: {eb.get(k)!r} -> {eo.get(k)!r}" for k in sorted(differ - allowed))
        assert listed_env <= differ, f"listed but not different: {sorted(listed_env - differ)}"
        # sys.path entry by entry, argv, the working folder: the same
        assert o[rank]["path"] == b[rank]["path"]
        assert o[rank]["argv"][0] == b[rank]["argv"][0] and o[rank]["cwd"] == b[rank]["cwd"]
        # the user's own sitecustomize.py ran in both, and PYTHONPATH is the user's own
        assert b[rank]["user_sitecustomize"] and o[rank]["user_sitecustomize"]
        assert eo["PYTHONPATH"] == eb["PYTHONPATH"] == str(site)


def test_readmes_list_is_the_parity_data():
    text = (ROOT / "README.md").read_text()
    section = text.split("### What differs from bare torchrun", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| `([^`]+)` \|", section, re.M)
    assert rows == [d.name for d in parity.DIFFERENCES]
