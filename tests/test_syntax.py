"""The line that set a failure up is read from the script's syntax tree (ddplab.engine.syntax), never from a pattern
over its text (issue 41): words in strings and comments are not code, a call split over lines is one call, and a
condition on the rank is found by the names it reads. Text only: no processes (the real runs that reach these
readings are in test_reasoning and the fault suite)."""
from __future__ import annotations

import textwrap

from ddplab.engine import classify, syntax
from ddplab.facts import Frame
from ddplab.result import RankError, RankResult, Where

F = "/job/train.py"


def _src(text: str) -> dict[str, str]:
    return {F: textwrap.dedent(text).lstrip("\n")}


def _line(s: dict[str, str], words: str, nth: int = 0) -> int:
    return [i + 1 for i, t in enumerate(s[F].splitlines()) if words in t][nth]


def test_a_condition_is_on_the_rank_by_the_names_it_reads_not_by_words_in_a_string():
    s = _src('''
        import os
        import torch.distributed as dist

        def save(trainer, model):
            if "rank" in model.name:
                dist.barrier()
            if trainer.is_global_zero:
                dist.barrier()
            if int(os.environ["LOCAL_RANK"]) == 0:
                dist.barrier()
            if RANK == 0:
                pass
            else:
                dist.barrier()
    ''')
    first, second, third, fourth = (_line(s, "dist.barrier()", k) for k in range(4))
    assert classify.rank_guard(Frame("save", F, first), s) is None          # "rank" is a string there
    assert classify.rank_guard(Frame("save", F, second), s).line == second - 1
    assert classify.rank_guard(Frame("save", F, third), s).line == third - 1
    assert classify.rank_guard(Frame("save", F, fourth), s) is None          # the else of a rank condition


def test_a_call_split_over_lines_is_one_call_and_a_commented_or_quoted_one_is_none():
    s = _src('''
        import datetime
        import torch.distributed as dist
        # dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=1))
        HELP = 'call init_process_group("gloo", timeout=...) once'
        dist.init_process_group(
            "gloo",
            timeout=datetime.timedelta(seconds=5),
        )
    ''')
    at = classify.site(classify.SITES["timeout-too-short"], F, s)
    assert at is not None and at.line == _line(s, "dist.init_process_group(", 1) == 5
    assert at.text == "dist.init_process_group("


def test_the_store_address_set_in_the_environment_is_found_by_its_key():
    s = _src('''
        import os
        print("set os.environ['MASTER_PORT'] = ... to move the store")
        os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "localhost", "29501"
    ''')
    assert classify.site(classify.SITES["store-address-set"], F, s).line == _line(s, 'os.environ["MASTER_ADDR"]')
    s2 = _src('''
        import os
        os.environ.update(MASTER_PORT="29501")
    ''')
    assert classify.site(classify.SITES["store-address-set"], F, s2).line == 2
    assert classify.site(classify.SITES["store-address-set"], F, _src("import os\nport = os.environ['MASTER_PORT']\n")) is None


def test_an_early_exit_is_a_rank_condition_whose_block_begins_by_leaving():
    s = _src('''
        import sys
        for step in range(10):
            if rank == 0 and step == 6:
                print("rank 0 stops here")
                break
            if master_process and step == 8:
                sys.exit(0)
    ''')
    assert classify.early_exit_site(F, s).line == _line(s, "if master_process")   # the one whose block begins so


def test_a_peer_writing_the_file_the_rank_failed_to_read_by_its_path_not_by_any_word():
    s = _src('''
        import torch
        PATH = "/tmp/shared.pt"
        def writer(x):
            time.sleep(1); torch.save(x, "/tmp/shared.pt")
        def other(x):
            torch.save(x, "/tmp/elsewhere.pt")
        def reader():
            return torch.load("/tmp/shared.pt")
    ''')
    err = RankError("FileNotFoundError", "[Errno 2] No such file or directory: '/tmp/shared.pt'",
                    (Frame("reader", F, _line(s, "torch.load")),), 10.0)

    def peer(line):
        return RankResult(0, 2, "exited", None, "SIGTERM",
                          where=Where("python", "sleep", frame=Frame("writer", F, line)))
    failing = RankResult(1, 1, "exited", None, None, error=err)
    assert classify.read_before_written((peer(_line(s, "time.sleep(1)")), failing), 1, s, {})
    assert not classify.read_before_written((peer(_line(s, "elsewhere")), failing), 1, s, {})


def test_the_receive_buffer_is_found_through_a_method_chain_and_a_script_constant():
    s = _src('''
        import torch
        import torch.distributed as dist
        WIDTH = 64
        def main():
            x = torch.empty(WIDTH * 2).to("cpu")
            dist.recv(x, src=0)
    ''')
    own = RankResult(1, 1, "exited", None, "SIGABRT",
                     error=RankError("RuntimeError", "x", (Frame("main", F, _line(s, "dist.recv")),), 0.0))
    culprits, at = classify.receiver_buffer_site(own, 128 * 4, s)
    assert culprits == (1,) and at.line == _line(s, "torch.empty")
    assert classify.receiver_buffer_site(own, 100, s) == ((), None)


def test_what_does_not_parse_gives_no_line():
    s = {F: "def broken(:\n    if rank == 0:\n        dist.barrier()\n"}
    assert syntax.tree(F, s) is None
    assert classify.rank_guard(Frame("broken", F, 3), s) is None
    assert classify.site(classify.SITES["timeout-too-short"], F, s) is None
