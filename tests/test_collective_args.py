"""The arguments channel (issue 41): each collective's arguments as the rank hook records them, compared across
ranks at the same call number (``callsites.args_differ``), on real 2-rank gloo runs of
tests/scripts/collective_args.py, and on call records as the hook writes them. Each test fails without the
channel: what it asserts is read from the hook's records (a root, a reduce op, a shape), never from the script."""
import importlib.util
from pathlib import Path

import pytest

from ddplab.engine import callsites, classify, signatures
from ddplab.facts import ArgsDiffer, CallArgs, CallSite, Frame
from ddplab.result import RunResult

SCRIPT = Path(__file__).parent / "scripts" / "collective_args.py"
LINES = SCRIPT.read_text().splitlines()
HOOK = Path(__file__).parents[1] / "src" / "ddplab" / "rank" / "hook" / "sitecustomize.py"


def line_of(text: str) -> int:
    start = LINES.index("def main(how):")
    return next(i + 1 for i, t in enumerate(LINES) if i >= start and text in t)


def call(n, op, args, line=10, file="/x/train.py"):
    return CallSite.from_dict({"n": n, "op": op, "user": [[file, line, "main"]], "lib": None, "args": args})


@pytest.mark.timeout(150)
def test_each_rank_broadcasting_from_its_own_rank_is_a_root_that_differs(run_lab):
    """bcast-root: broadcast(t, src=rank) hangs on gloo; both ranks stand in broadcast at the same call number of
    their records, whose roots are 0 and 1: collective-root-differs, at the broadcast's line."""
    r = run_lab(SCRIPT, args=["--how", "bcast-root"])
    assert r.status == "hung" and r.signature == "collective-root-differs", r.explain()
    d = r.args_differ
    assert (d.op, d.arg, d.param, d.values) == ("broadcast", "root", "src", ((0, 0), (1, 1))), d
    line = line_of("dist.broadcast(t, src=rank)")
    assert r.fix_at is not None and r.fix_at.line == line and r.culprits == ()
    assert "with different roots (src): rank 0 named rank 0; rank 1 named rank 1" in r.explain()
    # each rank's record of the call holds its arguments as data
    c = r.rank(1).calls[-1]
    assert c.op == "broadcast" and c.args.src == 1 and dict(c.args.tensors)["tensor"].shape == (4,)
    assert RunResult.from_dict(r.to_dict()).args_differ == d


@pytest.mark.timeout(150)
def test_a_reduce_op_that_differs_is_a_silent_check_finding(run_lab):
    """reduce-op: rank 0 all-reduces with SUM, rank 1 with MAX: gloo completes (both got the SUM, measured), the
    job ends ok, and --check names the reduction and each rank's op."""
    r = run_lab(SCRIPT, args=["--how", "reduce-op"], check=True)
    assert r.status == "ok", r.explain()
    (f,) = [f for f in r.check.findings if f.kind == "reduce-op-differs"]
    assert f.values == ((0, "SUM"), (1, "MAX")) and f.ranks == (1,), f
    assert "rank 0: SUM; rank 1: MAX" in r.explain()
    assert r.args_differ is not None and r.args_differ.arg == "reduce_op"


@pytest.mark.timeout(300)
@pytest.mark.parametrize("how", ["bcast-root-equal", "group-root-equal", "same"])
def test_arguments_equal_on_every_rank_give_no_finding(run_lab, how):
    """A src computed from the rank that is 0 on every rank, the same root given as group_src on one rank and as
    src on the other, and every collective with the same arguments: ok, nothing differs, nothing found."""
    r = run_lab(SCRIPT, args=["--how", how], check=True)
    assert r.status == "ok", r.explain()
    assert r.args_differ is None
    assert not [f for f in r.check.findings if f.kind == "reduce-op-differs"]
    assert any(c.args is not None for c in r.rank(0).calls)     # the channel recorded the calls' arguments


@pytest.mark.timeout(150)
def test_shapes_that_differ_are_shown_where_gloo_names_its_own_error(run_lab):
    """gather-shape: all_gather of 4 numbers on rank 0 and 5 on rank 1; gloo raises its size error (its own
    reading stays), and the diagnosis adds the shapes each rank passed, from the records."""
    r = run_lab(SCRIPT, args=["--how", "gather-shape"])
    assert r.status == "failed", r.explain()
    d = r.args_differ
    assert (d.op, d.arg, d.param, d.values) == ("all_gather", "shape", "tensor", ((0, (4,)), (1, (5,)))), d
    assert "with different shapes (tensor): rank 0 passed shape [4]; rank 1 passed shape [5]" in r.explain()


def test_arguments_that_may_differ_are_not_compared():
    """Point-to-point peers, gather's list (given on the root only), devices and all_to_all_single's tensors differ
    by design; a root given as group_src is compared as the global rank it names."""
    send = {0: (call(3, "send", {"tensor": [[4], "float32", "cpu"], "dst": 1}),),
            1: (call(3, "send", {"tensor": [[4], "float32", "cpu"], "dst": 0}),)}
    assert callsites.args_differ(send) is None
    gather = {0: (call(3, "gather", {"tensor": [[4], "float32", "cpu"], "gather_list": {"len": 2}, "dst": 0}),),
              1: (call(3, "gather", {"tensor": [[4], "float32", "cuda:1"], "dst": 0}),)}
    assert callsites.args_differ(gather) is None
    a2a = {0: (call(3, "all_to_all_single", {"output": [[3], "float32", "cpu"], "input": [[5], "float32", "cpu"]}),),
           1: (call(3, "all_to_all_single", {"output": [[5], "float32", "cpu"], "input": [[3], "float32", "cpu"]}),)}
    assert callsites.args_differ(a2a) is None
    # group [2, 3]: group_src=1 is global rank 3, the same root as src=3
    g = {0: (call(3, "broadcast", {"tensor": [[4], "float32", "cpu"], "group_src": 1, "group": [2, 3]}),),
         1: (call(3, "broadcast", {"tensor": [[4], "float32", "cpu"], "src": 3, "group": [2, 3]}),)}
    assert callsites.args_differ(g) is None
    assert CallArgs.from_dict({"group_src": 1, "group": [2, 3]}).root == 3
    assert CallArgs.from_dict({"src": 3, "group": [2, 3]}).group_root == 1
    # ...and group_src=0 there is global rank 2: a root that differs
    g[0] = (call(3, "broadcast", {"tensor": [[4], "float32", "cpu"], "group_src": 0, "group": [2, 3]}),)
    d = callsites.args_differ(g)
    assert d.arg == "root" and d.values == ((0, 2), (1, 3))
    # the first number that differs, not a later one; a different op at a number is the call sites' divergence
    calls = {0: (call(2, "all_reduce", {"op": "SUM"}), call(3, "all_reduce", {"op": "MAX"})),
             1: (call(2, "barrier", {}), call(3, "all_reduce", {"op": "SUM"}))}
    assert callsites.args_differ(calls).n == 3


def test_records_round_trip():
    c = call(5, "all_gather", {"tensor_list": {"len": 2, "first": [[4, 2], "float16", "cpu"]},
                               "tensor": [[4, 2], "float16", "cpu"], "async_op": True, "group": [0, 1]})
    assert CallSite.from_dict(c.to_dict()) == c
    assert dict(c.args.tensors)["tensor_list"].length == 2 and c.args.async_op is True
    d = ArgsDiffer(5, "all_gather", "shape", "tensor", ((0, (4,)), (1, (5,))), ((0, Frame("main", "/x.py", 3)),))
    assert ArgsDiffer.from_dict(d.to_dict()) == d


def _hook():
    spec = importlib.util.spec_from_file_location("_hook_under_test", HOOK)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)      # outside a ddplab run it installs nothing
    return module


def test_the_hook_describes_arguments_and_never_fails_the_call():
    import torch
    import torch.distributed as dist
    hook = _hook()
    c10d = dist.distributed_c10d
    t = torch.zeros(3, 4)
    assert hook._call_args(c10d.all_reduce, (t,), {}) == {"op": "SUM", "async_op": False,
                                                          "tensor": [[3, 4], "float32", "cpu"]}
    assert hook._call_args(c10d.all_reduce, (t, dist.ReduceOp.MAX), {})["op"] == "MAX"
    assert hook._call_args(c10d.broadcast, (t,), {"group_src": 0})["group_src"] == 0
    assert hook._call_args(c10d.all_gather, ([t, t], t), {})["tensor_list"] == {"len": 2, "first": [[3, 4], "float32", "cpu"]}

    class Odd:
        @property
        def shape(self):
            raise RuntimeError("no shape here")
    assert hook._call_args(c10d.all_reduce, (Odd(),), {}) == {"op": "SUM", "async_op": False}
    assert hook._call_args(object(), (1,), {}) == {}     # no signature: nothing recorded, nothing raised


def _rank(rank, where_op, call_, alive=True):
    from ddplab.defaults import RankState
    from ddplab.facts import Where
    from ddplab.result import RankResult
    return RankResult(rank=rank, pid=None, signal=None, state=RankState.HUNG if alive else RankState.EXITED,
                      exit_code=None if alive else 0,
                      where=Where("collective", where_op, None, None, None, 2) if where_op else None,
                      calls=(call_,) if call_ else ())


def test_the_root_reading_needs_every_rank_in_that_call_and_no_exception_in_flight():
    """collective-root-differs holds only where every rank is alive and blocked in the collective whose own call
    records differ in the root; a rank gone, or an exception in flight at the call, rules it out."""
    b = lambda src: call(4, "broadcast", {"tensor": [[4], "float32", "cpu"], "src": src})   # noqa: E731
    ranks = (_rank(0, "broadcast", b(0)), _rank(1, "broadcast", b(1)))
    assert classify.hang_signature(ranks, None) == "collective-root-differs"
    assert classify.hang_signature((_rank(0, "broadcast", b(0)), _rank(1, "broadcast", b(0))), None) != \
        "collective-root-differs"
    gone = (_rank(0, "broadcast", b(0)), _rank(1, None, b(1), alive=False))
    assert classify.hang_signature(gone, None) != "collective-root-differs"
    from dataclasses import replace
    from ddplab.facts import InFlight
    flight = replace(b(1), exc=InFlight("KeyError", "x", None))
    assert classify.hang_signature((_rank(0, "broadcast", b(0)), _rank(1, "broadcast", flight)), None) != \
        "collective-root-differs"
    assert signatures.get("collective-root-differs").lab == ""


@pytest.mark.timeout(150)
def test_a_group_that_differs_is_not_read_as_control_flow(run_lab):
    """group-differs: rank 0 all-reduces in a new_group of both ranks, rank 1 in the default group, at the same line
    and call number: the ledgers show different collective numbers (each group numbers its own), but the ranks' own
    records show one call with different groups: collective-group-differs, at that line (the text match over the
    script's `if rank == 0:` blocks named another line as the control flow's)."""
    r = run_lab(SCRIPT, args=["--how", "group-differs"])
    assert r.status == "hung" and r.signature == "collective-group-differs", r.explain()
    d = r.args_differ
    assert (d.op, d.arg, d.values) == ("all_reduce", "group", ((0, (0, 1)), (1, None))), d
    assert r.fix_at is not None and r.fix_at.line == line_of("dist.all_reduce(t, group=group if rank == 0 else None)")
    assert "rank 0 used a group of ranks [0, 1]; rank 1 used the default group" in r.explain()
