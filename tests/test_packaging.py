"""Set-up: pyproject.toml and environment.yml list the same dependencies; torch is pinned."""
import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _name(req: str) -> str:
    return re.split(r"[<>=!~\[ ;]", req.strip(), maxsplit=1)[0].lower().replace("_", "-")


def test_environment_yml_lists_the_same_dependencies_as_pyproject():
    py = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = {_name(r) for r in py["dependencies"]}
    for extra in py["optional-dependencies"].values():
        wanted |= {_name(r) for r in extra}
    # the pip: block of environment.yml (its items are indented deeper than the conda ones)
    pip_lines = re.findall(r"^ {6}- (\S.*)$", (ROOT / "environment.yml").read_text(), re.M)
    conda = {_name(r) for r in pip_lines if not r.startswith("-")}
    assert conda == wanted, f"only in environment.yml: {conda - wanted}; only in pyproject: {wanted - conda}"


def test_torch_is_pinned_everywhere():
    assert "torch==2.13.0" in (ROOT / "constraints.txt").read_text()
    assert "torch==2.13.0" in (ROOT / "environment.yml").read_text()
    makefile = (ROOT / "Makefile").read_text()
    assert "-c constraints.txt" in makefile
    assert "make test" in (ROOT / "README.md").read_text() or "make test" in (ROOT / ".ci" / "run").read_text()


def test_ci_runs_the_readme_test_command():
    readme = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    assert "make test" in readme and "make test" in ci
