"""Reading stacks captured from real hung ranks (py-spy JSON, faulthandler text, the worker
server's dump) and saying as data where each rank stands (stacks.where)."""
import json
from pathlib import Path

import pytest

from ddplab.engine import stacks
from ddplab.facts import Frame, Where

DATA = Path(__file__).parent / "data"


def test_pyspy_json_of_a_real_hang():
    r0 = stacks.where(stacks.parse_pyspy_json((DATA / "real_pyspy_lab01_rankcond_rank0.json").read_text()))
    r1 = stacks.where(stacks.parse_pyspy_json((DATA / "real_pyspy_lab01_rankcond_rank1.json").read_text()))
    assert (r0.kind, r0.op, r0.via) == ("collective", "barrier", None)
    assert r0.frame.file.endswith("labs/01_hang.py") and r0.frame.func == "main"
    assert r0.call.func == "barrier"
    assert (r1.kind, r1.op, r1.via) == ("collective", "all_reduce", "ddp-backward")
    assert r1.frame.file.endswith("labs/01_hang.py")
    assert r0.frame.line != r1.frame.line


def test_faulthandler_of_a_real_hang():
    r0 = stacks.where(stacks.parse_faulthandler((DATA / "real_faulthandler_lab01_broken_rank0.txt").read_text()))
    r1 = stacks.where(stacks.parse_faulthandler((DATA / "real_faulthandler_lab01_broken_rank1.txt").read_text()))
    assert (r0.kind, r0.op) == ("collective", "barrier")
    assert (r1.op, r1.via) == ("all_reduce", "ddp-backward")
    assert r0.frame.func == "main" and r1.frame.func == "main"


def test_faulthandler_keeps_only_the_last_dump():
    one = (DATA / "real_faulthandler_lab01_broken_rank0.txt").read_text()
    two = (DATA / "real_faulthandler_lab01_broken_rank1.txt").read_text()
    assert stacks.where(stacks.parse_faulthandler(one + two)).via == "ddp-backward"


def test_every_thread_dump_from_another_thread_picks_the_main_thread():
    # torch's debug server /stacks (the worker server's dump_traceback has the same format)
    frames = stacks.parse_faulthandler_main((DATA / "debug_server_stacks.html").read_text())
    assert frames[-1].func == "<module>"
    assert stacks.where(frames).op == "barrier"


@pytest.mark.parametrize("case,rank,expected", [
    ("hang_buffer_sync", 1, ("collective", "broadcast", "ddp-forward-buffers")),
    ("hang_buffer_sync", 0, ("collective", "all_reduce", None)),
    ("hang_different_op", 1, ("collective", "all_reduce", "ddp-backward")),
    ("hang_rank_exited", 0, ("collective", "all_reduce", None)),
])
def test_stacks_read_through_the_worker_server(case, rank, expected):
    saved = json.loads((DATA / f"run_{case}" / "result.json").read_text())["ranks"][rank]
    assert saved["stack_source"] == "worker-server"
    w = stacks.where([Frame.from_dict(f) for f in saved["stack"]])
    assert (w.kind, w.op, w.via) == expected
    assert w.frame.file.endswith(f"tests/scripts/{Path(saved['stack'][-1]['file']).name}")


@pytest.mark.parametrize("wchan,kind,op", [
    ("hrtimer_nanosleep", "sleep", "sleep"),
    ("anon_pipe_read", "other", "read from a pipe"),
    ("unix_stream_read_generic", "socket", "recv"),
    ("inet_csk_accept", "socket", "accept"),
    ("poll_schedule_timeout.constprop.0", "socket", "poll"),       # the kernel's suffixed name
    ("futex_wait_queue", "lock", "a lock or condition"),
])
def test_the_wait_channel_says_what_a_rank_in_a_c_call_waits_for(wchan, kind, op):
    user = Frame("wait_for_input", "/home/me/train.py", 12)
    w = stacks.where([user, Frame("main", "/home/me/train.py", 30)], wchan)
    assert (w.kind, w.op, w.frame) == (kind, op, user)


def test_a_stack_with_no_known_call_and_no_wait_channel_is_other():
    w = stacks.where([Frame("main", "/home/me/train.py", 30)])
    assert (w.kind, w.op, w.frame.line) == ("other", None, 30)


def test_where_round_trips():
    w = Where("collective", "all_reduce", "ddp-backward", Frame("main", "a.py", 3), Frame("backward", "b.py", 9), 7)
    assert Where.from_dict(json.loads(json.dumps(w.to_dict()))) == w
    assert Where.from_dict(None) is None


def test_library_frames_are_not_user_code():
    assert not stacks.is_user_file(stacks.__file__)
    assert not stacks.is_user_file("<frozen runpy>")
    assert not stacks.is_user_file("/x/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py")
    assert stacks.is_user_file(str(Path(__file__)))
