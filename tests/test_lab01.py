"""Lab 01 for real: every variant on 2 gloo ranks, and PyTorch's own timeout error."""
import pytest

from ddplab import catalog
from ddplab.workbook import lab01
from conftest import HANG_DEADLINE_S

pytestmark = pytest.mark.multiprocess
LAB = catalog.find_lab("01")


@pytest.mark.timeout(120)
@pytest.mark.parametrize("variant", ["broken", "rank-conditional"])
def test_hang_variants_name_each_ranks_line_and_collective(run_lab, variant):
    r = run_lab("01", variant=variant, deadline_s=HANG_DEADLINE_S)
    expect = LAB.variant(variant)
    assert (r.status, r.signature) == (expect.expect, expect.signature) == ("hung", "hang-different-collectives")
    r0, r1 = r.rank(0), r.rank(1)
    assert r0.waits_in == "barrier"
    assert r1.waits_in == "all_reduce (DDP gradients, inside backward)"
    for rank in (r0, r1):
        assert rank.state == "hung" and rank.user_frame.startswith("labs/01_hang.py:")
    assert r0.user_frame != r1.user_frame
    # The diagnosis names both ranks, their collectives and their lines.
    assert f"rank 0 waits in barrier at {r0.user_frame}" in r.diagnosis
    assert f"rank 1 waits in all_reduce (DDP gradients, inside backward) at {r1.user_frame}" in r.diagnosis
    # Rank 0 left the loop (broken: after 4 of its batches; rank-conditional: it never left step 1).
    loops = {rec["rank"]: rec["steps"] for rec in r.records_of("loop_done")}
    if variant == "broken":
        assert loops == {0: 4}
    else:
        assert loops == {}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("variant", ["fixed-sampler", "fixed-join"])
def test_fixed_variants_finish(run_lab, variant):
    r = run_lab("01", variant=variant, deadline_s=60)
    assert r.status == "ok" and r.signature is None
    done = {rec["rank"]: rec["steps"] for rec in r.records_of("done")}
    assert set(done) == {0, 1}
    if variant == "fixed-sampler":
        assert done == {0: 5, 1: 5}          # 40 rows, 2 ranks, batch 4: the same steps everywhere
    else:
        assert done == {0: 4, 1: 6}          # uneven inputs kept; Join made it finish


@pytest.mark.timeout(120)
def test_pytorch_timeout_error_is_recognised(run_lab):
    r = run_lab("01", variant="broken", args=["--pg-timeout-s", "5"], deadline_s=90)
    assert r.status == "failed" and r.signature == "collective-timeout"
    assert "Timed out waiting 5000ms" in r.excerpt


@pytest.mark.timeout(120)
def test_torch_debug_server_shows_the_hang_that_ddplab_diagnoses(tmp_path):
    """torch's in-job debug server, fetched over HTTP while the broken job hangs, shows each rank in
    the same collective at the same line as ddplab's diagnosis from outside; nothing outlives it."""
    from urllib.parse import urlsplit
    from ddplab.ports import holder
    from conftest import assert_nothing_left

    view = lab01.debug_server_view(deadline_s=HANG_DEADLINE_S + 8, run_root=tmp_path / "runs")
    assert view.outside.status == "hung" and view.outside.leftover == ()
    assert view.seen_at_s is not None and view.seen_at_s < view.outside.wall_s, view.to_dict()
    assert [w for _, w, _ in view.waits] == ["barrier", "all_reduce (DDP gradients, inside backward)"]
    assert view.agree, view.rows()
    assert "labs/01_hang.py" in view.page and view.outside.records_of("debug_server")
    assert_nothing_left(str(tmp_path / "runs"))
    assert holder(urlsplit(view.url).port)[0] is None  # the server's port is closed


def test_debug_server_page_is_read_per_rank():
    """A /stacks page captured from a real hung run of lab 01 (torch 2.13, gloo): each rank's main
    thread is found behind the server's own "Current thread", and classified as ddplab does."""
    from pathlib import Path
    from ddplab import stacks

    page = (Path(__file__).parent / "data" / "debug_server_stacks.html").read_text()
    blocks = lab01.stacks_by_rank(page)
    assert sorted(blocks) == [0, 1]
    where = {rank: stacks.where(stacks.parse_faulthandler_main(text)) for rank, text in blocks.items()}
    assert where[0].waits_in == "barrier" and where[0].user_frame.line == 109
    assert where[1].waits_in == "all_reduce (DDP gradients, inside backward)" and where[1].user_frame.line == 99


def test_default_timeout_is_read_from_torch():
    assert lab01.default_pg_timeout_s() == 30 * 60


def test_exercise_checkers_without_answers_do_not_run_anything():
    assert not lab01.check_timeout_answer(None).passed
    assert not lab01.check_timeout_answer(-1).passed
