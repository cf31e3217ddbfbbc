"""Notebooks 07-11 executed once each (the other half of tests/test_notebooks.py, in its own file
so that pytest-xdist runs the two halves on different workers)."""
import pytest

from notebook_check import LATER, execute_and_compare


@pytest.mark.notebook
@pytest.mark.multiprocess
@pytest.mark.timeout(600)
@pytest.mark.parametrize("path", LATER, ids=[p.stem for p in LATER])
def test_notebook_executes_once_and_its_checked_cells_match(path, session_runs_dir):
    execute_and_compare(path, session_runs_dir)
