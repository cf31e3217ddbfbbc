"""A result is data: it loads, prints and compares in a fresh interpreter with no view imported, and
its statuses, rank states and endings are enums after ``load()`` as they were when it was made."""
import json
import subprocess
import sys
from pathlib import Path

from ddplab.defaults import Ending, RankState, Status
from ddplab.result import RunResult

DATA = Path(__file__).parent / "data"
SAVED = sorted(DATA.glob("run_*/result.json"))


def test_there_are_saved_results_to_load():
    assert len(SAVED) >= 3


def test_load_prints_in_a_fresh_interpreter_without_any_view():
    code = ("import sys; from ddplab.result import RunResult; r = RunResult.load(sys.argv[1]); print(repr(r)); "
            "print(r == RunResult.load(sys.argv[1])); "
            "print(sorted(m for m in sys.modules if m.startswith('ddplab.') and ('render' in m or 'views' in m)))")
    for path in SAVED:
        out = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        lines = out.stdout.splitlines()
        saved = json.loads(path.read_text())
        assert lines[0].startswith("RunResult(") and f"status={saved['status']!r}" in lines[0]
        assert lines[1] == "True"
        assert lines[2] == "[]", "loading or printing a result imported a view"


def test_enums_after_load_and_round_trip():
    for path in SAVED:
        r = RunResult.load(path)
        assert type(r.status) is Status
        assert all(type(x.state) is RankState for x in r.ranks)
        again = RunResult.from_dict(json.loads(json.dumps(r.to_dict(), default=str)))
        assert again == r


def test_an_unknown_status_or_state_is_refused_on_load():
    d = json.loads(SAVED[0].read_text())
    import pytest
    with pytest.raises(ValueError):
        RunResult.from_dict({**d, "status": "stuck"})
    d["ranks"][0]["state"] = "sleeping"
    with pytest.raises(ValueError):
        RunResult.from_dict(d)


def test_endings_read_back_from_older_folders():
    assert Ending.of(None) is Ending.FINISHED and Ending.of("stall") is Ending.STALL
