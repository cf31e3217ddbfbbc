"""The package a practitioner installs: a wheel built from this checkout (setuptools' build backend,
as ``python -m build`` runs it), installed into a fresh venv with no clone beside it, runs a broken
script from a temporary folder and explains it; ``ddplab list`` says where the labs are.

The fresh venv takes torch and the other dependencies from this venv's site-packages through a .pth
line (no download; this venv's own editable ddplab is not on that path), and the wheel itself with
--no-deps."""
import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from conftest import assert_nothing_left

ROOT = Path(__file__).resolve().parents[1]
HANG = '''"""torchrun --nproc-per-node 2 hang.py: the ranks call different collectives."""
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
if dist.get_rank() == 0:
    dist.barrier()
else:
    dist.all_reduce(torch.ones(1))
'''


def _install(python: Path, *args: str) -> None:
    uv = Path(sys.executable).with_name("uv")
    cmd = ([str(uv), "pip", "install", "--quiet", "--python", str(python)] if uv.exists()
           else [sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet"])
    subprocess.run(cmd + list(args), check=True, timeout=300)


@pytest.mark.multiprocess
@pytest.mark.timeout(400)
def test_the_wheel_runs_and_explains_a_broken_script_with_no_clone(tmp_path):
    # the package's sources copied out first: a build writes build/ beside them, and the clone's build/
    # is the workbook's
    source = tmp_path / "source"
    shutil.copytree(ROOT / "src", source / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        if (ROOT / name).exists():
            shutil.copy2(ROOT / name, source / name)
    dist = tmp_path / "dist"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
                    "-w", str(dist), str(source)], check=True, timeout=300)
    wheel = next(dist.glob("ddplab-*.whl"))
    import ddplab
    assert wheel.name.startswith(f"ddplab-{ddplab.__version__}-")      # the version from one place
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    site = Path(subprocess.check_output([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                        text=True).strip())
    (site / "_ddplab_test_deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    _install(python, "--no-deps", str(wheel))
    work = tmp_path / "work"
    work.mkdir()
    (work / "hang.py").write_text(HANG)
    env = {k: v for k, v in os.environ.items() if not k.startswith("DDPLAB_")}
    ddplab_exe = str(venv / "bin" / "ddplab")
    where = subprocess.check_output([str(python), "-c", "import ddplab; print(ddplab.__file__)"], text=True,
                                    cwd=work, env=env).strip()
    assert where.startswith(str(venv)), where                 # the wheel's, not this checkout's
    listed = subprocess.run([ddplab_exe, "list"], cwd=work, env=env, capture_output=True, text=True, timeout=120)
    assert listed.returncode == 0 and "No labs here" in listed.stdout, listed.stdout + listed.stderr
    run = subprocess.run([ddplab_exe, "run", "hang.py", "--nproc", "2", "--json"], cwd=work, env=env,
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 3, run.stdout[-2000:] + run.stderr[-2000:]      # hung
    result = json.loads(run.stdout)
    assert result["status"] == "hung" and result["signature"] is not None
    run_dir = Path(result["run_dir"])
    assert run_dir.resolve().is_relative_to((work / "runs").resolve())       # beside the user
    by_rank = {r["rank"]: r for r in result["ranks"]}
    assert by_rank[0]["where"]["frame"]["file"].endswith("hang.py") and by_rank[0]["where"]["frame"]["line"] == 7
    explained = subprocess.run([ddplab_exe, "explain", str(run_dir)], cwd=work, env=env, capture_output=True,
                               text=True, timeout=120)
    assert explained.returncode in (0, 3) and "hung" in explained.stdout, explained.stdout + explained.stderr
    assert_nothing_left(str(work))
