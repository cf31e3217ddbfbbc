"""A newcomer's machine: what a part needs, said in one line, and a skipped part is not a failure.

The real route without nft and chromium runs in CI (.ci/without-tools hides them in a mount
namespace); these tests check the pieces on any machine: a tool hidden from PATH, the set-up script
that installs nothing when told not to, and the build's skip of a lab that cannot run here."""
import json
import os
import subprocess
import sys
from pathlib import Path

from ddplab.origins import cluster
from ddplab.tools import system
from ddplab.course import build

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "src" / "ddplab" / "tools" / "system.py"


def test_a_missing_tool_is_named_with_its_install_command(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))             # nothing on PATH
    monkeypatch.delenv("DDPLAB_CHROMIUM", raising=False)
    needs = system.missing(["ip", "tc", "nft", "chromium"])
    # one line per package: ip and tc both come from iproute2
    assert [str(n) for n in needs] == ["needs ip: apt-get install iproute2", "needs nft: apt-get install nftables",
                                       "needs chromium: apt-get install chromium"]
    assert str(cluster.requirement()) == "needs ip: apt-get install iproute2"


def test_only_the_missing_tool_is_named(monkeypatch, tmp_path):
    for tool in ("ip", "tc", "unshare"):                  # all of lab 09's tools but nft
        exe = tmp_path / tool
        exe.write_text("#!/bin/sh\n")
        exe.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    assert system.missing(system.PARTS["labs"][1]) == [system.Need("nft", "apt-get install nftables")]
    if sys.platform == "linux":
        assert cluster.requirement() == system.Need("nft", "apt-get install nftables")


def test_chromium_from_the_environment_must_be_executable(monkeypatch, tmp_path):
    monkeypatch.setenv("DDPLAB_CHROMIUM", str(tmp_path / "nothing-here"))
    assert system.where("chromium") is None
    exe = tmp_path / "chromium"
    exe.write_text("#!/bin/sh\n")
    exe.chmod(0o755)
    monkeypatch.setenv("DDPLAB_CHROMIUM", str(exe))
    assert system.where("chromium") == str(exe)


def test_the_setup_script_switched_off_installs_nothing_and_says_what_is_skipped(tmp_path):
    env = dict(os.environ, PATH=str(tmp_path), DDPLAB_SYSTEM_PACKAGES="0")
    env.pop("DDPLAB_CHROMIUM", None)
    p = subprocess.run([sys.executable, str(SCRIPT), "install", "labs", "browser"], env=env,
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    assert "== lab 09 (two nodes on one machine) will be skipped: needs nft: apt-get install nftables " \
           "(DDPLAB_SYSTEM_PACKAGES=0)" in lines
    assert any(ln.startswith("== the browser test will be skipped: needs chromium: apt-get install chromium")
               for ln in lines)
    assert not any("apt-get install" in ln and "will be skipped" not in ln for ln in lines)   # no install tried


def test_without_npm_the_classroom_hub_is_skipped_with_the_proxy_install_command(tmp_path):
    env = dict(os.environ, PATH=str(tmp_path), DDPLAB_SYSTEM_PACKAGES="0",
               DDPLAB_CONFIGURABLE_HTTP_PROXY=str(tmp_path / "configurable-http-proxy"))
    p = subprocess.run([sys.executable, str(SCRIPT), "install", "classroom"], env=env,
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    assert "== the classroom hub will be skipped: needs configurable-http-proxy: npm install --prefix build/tools " \
           "configurable-http-proxy@4 (DDPLAB_SYSTEM_PACKAGES=0)" in lines, lines
    assert "== the classroom hub will be skipped: needs npm: apt-get install npm (DDPLAB_SYSTEM_PACKAGES=0)" in lines
    assert not any("npm install" in ln and "will be skipped" not in ln for ln in lines)   # no install tried


def test_the_setup_script_refuses_an_unknown_part():
    p = subprocess.run([sys.executable, str(SCRIPT), "install", "gpus"], capture_output=True, text=True, timeout=60)
    assert p.returncode != 0 and "unknown part 'gpus'" in p.stderr
    p = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and "usage:" in p.stderr


def test_the_build_skips_a_lab_this_machine_cannot_run_and_exits_0(monkeypatch, tmp_path, capsys):
    """Lab 01 stands in for any lab whose requirement() is not met (the real lab 09 without nft runs
    in .ci/without-tools): nothing of it runs, its notebook and every variant are reported skipped
    with the reason, and the build exits 0."""
    need = system.Need("nft", "apt-get install nftables")
    real = build.requirement
    (tmp_path / "nb").mkdir()                             # notebook 00 always runs: leave it out here
    (tmp_path / "nb" / "01_hang.ipynb").write_bytes((build.NOTEBOOK_DIR / "01_hang.ipynb").read_bytes())
    monkeypatch.setattr(build, "NOTEBOOK_DIR", tmp_path / "nb")
    monkeypatch.setattr(build, "requirement", lambda n: need if n == "01" else real(n))
    assert build.main(["--labs", "01", "--out", str(tmp_path / "out")]) == 0
    out = capsys.readouterr().out
    assert "01_hang: skipped (needs nft: apt-get install nftables)" in out.splitlines()
    tmp_path = tmp_path / "out"
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["runs"] and {r["status"] for r in summary["runs"]} == {"skipped"}
    assert {r["skipped"] for r in summary["runs"]} == {str(need)}
    assert [(n["name"], n["status"], n["skipped"]) for n in summary["notebooks"]] == \
        [("01_hang.ipynb", "skipped", str(need))]
    assert not (tmp_path / "runs" / "_build").exists()               # no variant was run
    assert "skipped (needs nft: apt-get install nftables)" in (tmp_path / "summary.md").read_text()


def test_a_lab_without_a_requirement_is_never_skipped():
    assert build.requirement("01") is None
    assert build.requirement("99") is None             # no such workbook module
