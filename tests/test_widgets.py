"""The ipywidgets panel: built from the lab catalog, and a click starts a real run."""
import re

import pytest

from conftest import assert_nothing_left


def test_panel_lists_the_labs_variants():
    from ddplab.course.widgets import panel
    p = panel("01")
    assert list(p.variant.options) == ["broken", "rank-conditional", "fixed-sampler", "fixed-join"]
    p.variant.value = "fixed-join"
    assert "Join" in p.about.value and "expected: ok" in p.about.value


def test_panel_rejects_an_unknown_lab():
    from ddplab import DdplabError
    from ddplab.course.widgets import panel
    with pytest.raises(DdplabError, match="ddplab list"):
        panel("99")


@pytest.mark.multiprocess
@pytest.mark.timeout(120)
def test_clicking_run_starts_a_real_job(session_runs_dir):
    from ddplab.course.widgets import panel
    p = panel("01")
    seen = []
    p.status.observe(lambda change: seen.append(change["new"]), "value")
    p.variant.value = "fixed-sampler"
    p.button.click()
    assert p.result is not None and p.result.status == "ok" and p.result.nproc == 2
    # the live status line was updated while the job ran (about once a second), naming each rank
    # every live line names both ranks, each alone or as one group in the same state ("ranks 0-1: running")
    assert seen and all(re.search(r"rank 0: .*rank 1: |ranks 0-1: ", s) for s in seen)
    assert p.button.description == "Run" and not p.button.disabled
    assert_nothing_left(str(session_runs_dir))
