"""Reading stacks captured from real hung ranks (py-spy JSON and faulthandler text)."""
from pathlib import Path

from ddplab import stacks

DATA = Path(__file__).parent / "data"


def test_pyspy_json_of_a_real_hang():
    r0 = stacks.where(stacks.parse_pyspy_json((DATA / "real_pyspy_lab01_rankcond_rank0.json").read_text()))
    r1 = stacks.where(stacks.parse_pyspy_json((DATA / "real_pyspy_lab01_rankcond_rank1.json").read_text()))
    assert r0.waits_in == "barrier" and r0.kind == "collective"
    assert r0.user_frame.file.endswith("labs/01_hang.py") and r0.user_frame.func == "main"
    assert r1.kind == "backward" and "DDP gradients" in r1.waits_in
    assert r1.user_frame.file.endswith("labs/01_hang.py")
    assert r0.user_frame.line != r1.user_frame.line


def test_faulthandler_of_a_real_hang():
    r0 = stacks.where(stacks.parse_faulthandler((DATA / "real_faulthandler_lab01_broken_rank0.txt").read_text()))
    r1 = stacks.where(stacks.parse_faulthandler((DATA / "real_faulthandler_lab01_broken_rank1.txt").read_text()))
    assert r0.waits_in == "barrier"
    assert r1.kind == "backward"
    assert r0.user_frame.func == "main" and r1.user_frame.func == "main"


def test_faulthandler_keeps_only_the_last_dump():
    one = (DATA / "real_faulthandler_lab01_broken_rank0.txt").read_text()
    two = (DATA / "real_faulthandler_lab01_broken_rank1.txt").read_text()
    frames = stacks.parse_faulthandler(one + two)
    assert stacks.where(frames).kind == "backward"


def test_library_frames_are_not_user_code():
    assert not stacks.is_user_file(stacks.__file__)
    assert not stacks.is_user_file("<frozen runpy>")
    assert not stacks.is_user_file("/x/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py")
    assert stacks.is_user_file(str(Path(__file__)))


def test_describe_reads_like_a_diagnosis():
    w = stacks.Where(stacks.Frame("main", "labs/01_hang.py", 57), "barrier", "collective")
    assert stacks.describe(0, w) == "rank 0 waits in barrier at labs/01_hang.py:57 in main"
