"""Classification: one pure function, ``judge(Evidence) -> Verdict`` (status, signature, stall
facts, per-rank facts, the first failure, the divergence), for a job ddplab started, one it
attached to, and the merged folders of several nodes alike.

No I/O and no clock here: everything comes in as data (``evidence.Evidence``: what the watch loop
saw, the live ranks captured at the verdict, what the ranks left behind), so every rule is tested
on evidence captured from real runs. Sentences are made later, by ``ddplab.views.render``.
"""
from __future__ import annotations

import ast
import re
from dataclasses import dataclass, replace
from typing import Callable, Mapping

from ddplab.engine import ledger as ledger_mod
from ddplab.engine import callsites, printed, signatures, stacks, syntax
from ddplab.defaults import ALIVE, Ending, RankState, Status
from ddplab.engine.evidence import Evidence, LiveRank, RunEvidence, raised_before
from ddplab.engine.reasons import Asks, FailureFacts, facts_from_text
from ddplab.engine.reasons import init_asks, rendezvous_asks, spawns
from ddplab.facts import ArgsDiffer, CallDivergence
from ddplab.result import RankResult, Stall

# the ranks still alive stood blocked: the stall rule fired, or torch dumped them (its watchdog's timeout)
BLOCKED = (Ending.STALL, Ending.DUMPED)

# A rank's error that says only that a peer went away: a consequence, never the cause.
CONSEQUENCES = {"peer-lost"}


@dataclass(frozen=True)
class Verdict:
    status: Status
    signature: str | None
    excerpt: str | None
    ranks: tuple[RankResult, ...]
    first_failure: int | None
    divergence: ledger_mod.Divergence | None
    stall: Stall | None = None
    culprits: tuple[int, ...] = ()           # the ranks the evidence blames (() where it blames none)
    fix_at: stacks.Frame | None = None       # the line of the culprit's script that set the failure up
    calls_diverged: CallDivergence | None = None   # where the ranks' recorded call sites part
    args_differ: ArgsDiffer | None = None          # the first call whose arguments that must agree differ across ranks
    stopped: Stall | None = None             # progress at an interrupt or a limit (RunResult.stopped)
    printed: tuple = ()                      # what the ranks printed with different values (engine.printed)

    def fields(self) -> dict:
        """The RunResult fields this verdict decides."""
        return {"status": self.status, "signature": self.signature, "excerpt": self.excerpt, "ranks": self.ranks,
                "first_failure": self.first_failure, "divergence": self.divergence, "stall": self.stall,
                "culprits": self.culprits, "fix_at": self.fix_at, "calls_diverged": self.calls_diverged,
                "args_differ": self.args_differ, "stopped": self.stopped, "printed": self.printed}


def keeping_alive(threads) -> tuple:
    """The threads that keep a rank alive whose main thread has finished: not daemon threads, still running
    at its shutdown (the rank hook's record) or beside a main thread waiting in threading's _shutdown."""
    return tuple(t for t in threads or () if not t.main and not t.daemon)


def joining_child_at_exit(frames) -> stacks.Frame | None:
    """The frame in which a rank's main thread, at interpreter exit, joins a child process it started
    (multiprocessing's exit handler ``_exit_function`` calling ``join`` on each child that is not a daemon);
    None when its stack shows no such wait. Read from the stack's frames (function and library file)."""
    def lib(f, name, path):
        return f.func.rsplit(".", 1)[-1] == name and f.file.replace("\\", "/").endswith(path)
    if not any(lib(f, "_exit_function", "multiprocessing/util.py") for f in frames):
        return None
    return next((f for f in frames if lib(f, "join", "multiprocessing/process.py")), None)


def locate(live: LiveRank, threads: tuple = ()) -> stacks.Where:
    """Where a live rank stands: its stack and wait channel, numbered from its ledger."""
    w = stacks.where(live.frames, live.wchan)
    keep = keeping_alive(threads)
    if keep and w.kind == "lock" and any(f.func == "_shutdown" and f.file.replace("\\", "/").endswith("/threading.py")
                                         for f in live.frames[:3]):
        # its main thread finished and waits in threading's shutdown for a thread that is not a daemon
        t = keep[0]
        user = next((f for f in t.frames if stacks.is_user_file(f.file)), None)
        return stacks.Where("thread", t.name, None, user, t.frames[0] if t.frames else None)
    join = joining_child_at_exit(live.frames)
    if join is not None:
        # its main thread finished and waits in multiprocessing's exit handler for a child that is not a daemon:
        # the one still running, and the user's line that started it (the hook's record), where known
        child = next((c for c in live.children if c.alive and not c.daemon), None)
        return stacks.Where("child", child.name if child else None, None, child.started if child else None, join)
    p = ledger_mod.pending(live.ledger)
    if p is not None and w.kind in ("collective", "lock", "other"):
        # The ledger knows the exact collective and its number; a stack in C++ (work.wait(), a
        # futex) shows none.
        return stacks.Where("collective", p.op, w.via if w.kind == "collective" else None, w.frame, w.call, p.seq,
                            library=w.library)
    return w


def rank_results(nproc: int, ended_by: Ending, returncode: int | None, ev: RunEvidence,
                 live: Mapping[int, LiveRank], ledgers: Mapping[int, tuple], cpu: Mapping[int, float],
                 records: Mapping[int, tuple], busy: Mapping[int, float | None] = {}) -> tuple[RankResult, ...]:
    out = []
    for rank in range(nproc):
        info = ev.infos.get(rank, {})
        given = ({"host": info.get("master_addr"), "port": int(info["master_port"])}
                 if info.get("master_port") else None)
        log = ev.logs.get(rank, "")
        common = dict(rank=rank, pid=info.get("pid"), error=ev.errors.get(rank), cpu_s=cpu.get(rank),
                      cpu_busy=busy.get(rank),
                      consequence=(_is_consequence(ev, rank) if rank in ev.errors
                                   else _ended_for_another(ev, rank)),
                      given=given, records=tuple(records.get(rank, ())),
                      log_tail="\n".join(log.splitlines()[-15:]),
                      threads=tuple(live[rank].threads) if rank in live and live[rank].threads
                      else ev.threads.get(rank, ()),
                      calls=tuple(live[rank].calls) if rank in live and live[rank].calls else ev.calls.get(rank, ()),
                      ended=ev.ended.get(rank))
        if rank in live:
            lv = live[rank]
            out.append(RankResult(
                state=RankState.HUNG if ended_by in BLOCKED else RankState.RUNNING, exit_code=None, signal="SIGTERM",
                where=locate(lv, common["threads"]), ledger=lv.ledger or tuple(ledgers.get(rank, ())),
                stack=tuple(lv.frames),
                stack_source=lv.source, connections=lv.connections, polls=tuple(lv.polls),
                **_probe_facts(lv.dialling), **common))
            continue
        frames, source = (), None
        if rank in ev.fatal:
            frames, source = tuple(ev.fatal[rank]), "faulthandler (fatal signal)"
        elif common["error"] is not None:
            frames, source = common["error"].frames, "exception record"
        elif log:
            tb = stacks.parse_traceback(log)
            frames, source = (tuple(tb), "traceback") if tb else ((), None)
        if rank in ev.exits:
            f = ev.exits[rank]
            code = f["exitcode"]
            state, exit_code, sig = RankState.EXITED, (code if code >= 0 else None), (f.get("signal") if code < 0 else None)
        # no record of it while others have theirs: no process had this rank number, even in a job that
        # ended 0 (nodes that disagree on WORLD_SIZE number their ranks past the ones started)
        elif not info and (returncode not in (0, None) or ended_by != Ending.FINISHED or ev.infos):
            state, exit_code, sig = RankState.NOT_STARTED, None, None
        elif returncode == 0 or rank in ev.clean_exit:
            state, exit_code, sig = RankState.EXITED, 0, None
        else:
            # torchrun ended it after another rank failed (its exit is not in torchrun's failures).
            state, exit_code, sig = RankState.EXITED, None, "SIGTERM"
        where = None
        if rank in ev.fatal and frames:
            # died on a fatal signal (gloo's SIGABRT): where, from faulthandler's dump
            where = locate(LiveRank(rank, info.get("pid") or 0, frames=list(frames),
                                    ledger=tuple(ledgers.get(rank, ()))))
        if not frames and sig == "SIGTERM" and rank in ev.terminated:
            # ended by torchrun after another rank failed: where it was then (the hook's SIGTERM dump)
            frames, source = tuple(ev.terminated[rank]), "faulthandler (SIGTERM)"
            where = locate(LiveRank(rank, info.get("pid") or 0, frames=list(frames),
                                    ledger=tuple(ledgers.get(rank, ()))))
        out.append(RankResult(state=state, exit_code=exit_code, signal=sig, ledger=tuple(ledgers.get(rank, ())),
                              stack=frames, stack_source=source, where=where,
                              asked=common["error"].asked if common["error"] is not None else None, **common))
    return tuple(out)


def _probe_facts(found: dict | None) -> dict:
    """The rank hook's answer about a blocked main thread, split into RankResult's fields: the store it
    dials, the peer of a blocked send/recv, what it asked init_process_group for."""
    found = dict(found or {})
    peer, asked = found.pop("p2p", None), found.pop("asked", None)
    return {"dialling": found or None, "peer": peer, "asked": asked}


def first_failure(ev: RunEvidence, ranks: tuple[RankResult, ...]) -> int | None:
    """The rank whose own error started the failure: the earliest exception that is not a
    consequence (a lost peer); else a rank that died on a fatal signal; else the earliest recorded
    exception; else the earliest failed exit torchrun saw (SIGTERMs, sent to the others, last);
    else torchrun's root cause."""
    recorded = sorted((e.time, r) for r, e in ev.errors.items())
    causes = [r for _, r in recorded if not _is_consequence(ev, r)]
    if causes:
        return causes[0]
    # a rank that ended itself with os._exit(n != 0): no traceback, no exit handler, only the hook's record
    ended = [r for r, e in sorted(ev.ended.items()) if e.code not in (0, None, "0")]
    if ended:
        return ended[0]
    if ev.fatal:  # a rank that died on a fatal signal (gloo's SIGABRT) before a peer's "connection closed"
        return min(ev.fatal)
    if killed_from_outside(ev):  # SIGKILL with no record (the OOM killer) before a peer's "connection closed"
        return min(killed_from_outside(ev))
    if recorded:
        return recorded[0][1]
    # A SIGTERM is what torchrun (or ddplab) sends the others once one rank failed; torchrun's
    # timestamps are whole seconds, so a rank that aborted (SIGABRT) often ties with the peers it
    # took down: those come after it.
    failed = sorted((f.get("signal") == "SIGTERM", f.get("timestamp") or 0, r)
                    for r, f in ev.exits.items() if f.get("exitcode") != 0)
    real = [r for _, _, r in failed if not _is_consequence(ev, r)]
    if real:
        return real[0]
    if failed:
        return failed[0][2]
    root = (ev.torchrun or {}).get("torchrun_root_cause")
    return int(root) if root is not None else None


def killed_from_outside(ev: RunEvidence) -> list[int]:
    """Ranks that ended on SIGKILL and left no exception record, while every rank that did leave
    one only lost a peer: killed from outside Python (the kernel's OOM killer, kill -9), not by
    torchrun stopping the others (it sends SIGTERM first, and those ranks record nothing or a
    consequence after the killed rank)."""
    if any(not _is_consequence(ev, r) for r in ev.errors):
        return []
    return sorted(r for r, f in ev.exits.items() if f.get("signal") == "SIGKILL" and r not in ev.errors)


def _rank_text(ev: RunEvidence, rank: int) -> str:
    e = ev.errors.get(rank)
    own = f"{e.type}: {e.message}\n{e.cause or ''}\n" if e else ""
    return own + ev.logs.get(rank, "")


def _ended_for_another(ev: RunEvidence, rank: int) -> bool:
    """A rank that raised nothing of its own and that torchrun ended (SIGTERM) after another rank
    failed: under load torchrun's SIGTERM can arrive before the peer's "connection closed"."""
    others_failed = any(r != rank for r in ev.errors) or any(r != rank for r in ev.fatal)
    return ev.exits.get(rank, {}).get("signal") == "SIGTERM" and others_failed


def _is_consequence(ev: RunEvidence, rank: int) -> bool:
    e = ev.errors.get(rank)
    return _consequence_text(f"{e.type}: {e.message}" if e else ev.logs.get(rank, ""))


def _consequence_text(text: str) -> bool:
    m = signatures.match_text(text)
    return m is not None and m[0].id in CONSEQUENCES


def failure_facts(ev: RunEvidence, first: int | None, ledger: tuple = (), stack: tuple = (),
                  ranks: tuple[RankResult, ...] = (), printed: tuple = ()) -> FailureFacts | None:
    """What the catalog's premises are checked against: the first failing rank's frames (its
    exception's, else its stack: a fatal signal's dump, else its log's traceback), its ledger, and
    (``ranks``) the peers still at work in their own code when the job was stopped."""
    if first is None:
        return None
    working = tuple(r.rank for r in busy_peers(ranks, first))
    led = ev.final_ledgers.get(first) or tuple(ledger) or None
    e = ev.errors.get(first)
    calls = ev.calls.get(first) or None
    if calls and calls[-1].exc is not None and _consequence_text(f"{calls[-1].exc.type}: {calls[-1].exc.message}"):
        # the exception in flight at its last call was itself a lost peer's consequence: not where it started
        calls = calls[:-1] + (replace(calls[-1], exc=None),)
    if e is not None:
        return FailureFacts(e.frames, led, calls, nested=e.nested, in_flight=callsites.failed_in_flight(e.frames, calls),
                            exit_code=_own_exit(e), peers_exited=tuple(
                                r for r, o in sorted(ev.errors.items()) if r != first and _own_exit(o)),
                            paths=e.paths, peers_working=working, rank=first, values=e.values,
                            peers_same_error=tuple(r for r, o in sorted(ev.errors.items()) if r != first
                                                   and (o.type, o.message) == (e.type, e.message)),
                            printed=printed if e.paths else ())
    if first in ev.fatal or stack:
        frames = tuple(ev.fatal.get(first) or stack)
        return FailureFacts(frames, led, calls, in_flight=callsites.failed_in_flight(frames, calls))
    return replace(facts_from_text(ev.logs.get(first, "")), ledger=led)


def _own_exit(e) -> str | None:
    """The code a rank passed to sys.exit (exit, quit) when it ended itself with a non-zero code and no exception
    in hand: the rank hook records it as a SystemExit whose message is the code (a framework's exit while
    handling the script's exception is recorded as that exception, with ``exited``)."""
    if e is None or e.type != "SystemExit" or e.exited is not None or e.message in ("", "0", "None"):
        return None
    return e.message


def failed_signature(ev: RunEvidence, first: int | None, ledger: tuple = (), stack: tuple = (),
                     ranks: tuple[RankResult, ...] = (), said: tuple = ()) -> tuple[str | None, str | None]:
    """The catalog entry for a failed run: the first failing rank's own exception first (the
    record's type and message), then its log, then any rank's log or torchrun's output when the
    first rank's words are generic. An entry is named only where the evidence holds its premise."""
    facts = failure_facts(ev, first, ledger, stack, ranks, said)
    m = signatures.match_text(_rank_text(ev, first), facts) if first is not None else None
    flight = signatures.get("exception-in-collective")
    if facts is not None and signatures.holds(flight, facts) and (m is None or m[0].id in flight.replaces):
        # the rank failed in a collective it called while an exception was propagating: the collective's own
        # error (gloo's size mismatch, a lost peer) is what that call met, not what started it
        return flight.id, f"{facts.in_flight.exc.type}: {facts.in_flight.exc.message}"[:400]
    if m is None and first in ev.ended and first not in ev.errors:
        # it ended itself (os._exit) and said nothing known: the others' words are only that it went away
        return None, None
    if m is None or m[0].id in signatures.GENERIC:
        every = "\n".join(_rank_text(ev, r) for r in sorted(set(ev.logs) | set(ev.errors)) if r != first)
        m_all = signatures.match_text(every + "\n" + ev.console)
        if m_all is not None and (m is None or m_all[0].id not in signatures.GENERIC):
            m = m_all
    return (m[0].id, m[1]) if m else (None, None)


@dataclass(frozen=True)
class HangFacts:
    """What the hang rules (``signatures.HANG_RULES``) look at."""
    alive: tuple[RankResult, ...]          # ranks still running when the job stopped
    gone: tuple[RankResult, ...]           # ranks that had exited
    in_coll: tuple[RankResult, ...]        # live ranks blocked in a collective
    ops: frozenset                         # (op, seq) of those collectives
    at_rendezvous: bool                    # a live rank waits at the rendezvous or on the store
    any_ledger: bool                       # a live rank has a collective ledger
    blocked: tuple                         # (rank, address) of connections getting no answer
    divergence_kind: str | None
    in_p2p: tuple[RankResult, ...] = ()    # live ranks blocked in a point-to-point send/recv
    p2p_deadlock: bool = False             # every live rank in a blocking send (or every one in a recv)
                                           # to a peer that is itself in the same direction: an ordering deadlock
    spawned: tuple[RankResult, ...] = ()   # live ranks waiting for processes they started with mp.spawn
    asks: Asks | None = None               # what the processes in init_process_group asked it for
    gone_joined: bool = False              # every exited rank had issued the collectives the others wait in
    in_flight: tuple = ()                  # (rank, CallSite) of live ranks blocked in a collective they called
                                           # while an exception was in flight in that thread (the hook's records)
    group_parted: bool = False             # the ranks' call records first part at a new_group (some ranks' k-th
                                           # new_group is another call than the others'), and a live rank waits in
                                           # new_group: the groups are numbered in call order on every rank
    polling: tuple = ()                    # (rank, facts.Poll): a live rank not in torch.distributed that stands in the
                                           # code that looked for a missing file again and again (the hook's
                                           # records), while every other live rank waits in a collective
    tag_mismatch: tuple = ()               # (sender, receiver, send tag, receive tag): a live rank blocked in a send
                                           # to a peer blocked in a receive from it with another tag (the hook's
                                           # live answer: op, peer, tag of each blocked call)
    kept_alive: tuple[RankResult, ...] = ()  # live ranks whose main thread finished and that Python keeps alive at
                                             # exit: for a non-daemon thread (where.kind "thread": the hook's
                                             # thread records) or a child process it joins ("child": its stack)
    args_differ: ArgsDiffer | None = None  # every live rank blocked in the same collective, at the same call number
                                           # of its own records, called with arguments that must agree and do not


def hang_facts(ranks: tuple[RankResult, ...], divergence: ledger_mod.Divergence | None) -> HangFacts:
    alive = tuple(r for r in ranks if r.state in ALIVE)
    in_coll = tuple(r for r in alive if r.where is not None and r.where.kind == "collective")
    in_p2p = tuple(r for r in alive if r.where is not None and r.where.kind == "p2p")
    return HangFacts(
        alive=alive, gone=tuple(r for r in ranks if r.state == RankState.EXITED), in_coll=in_coll,
        ops=frozenset((r.where.op, r.where.seq) for r in in_coll),
        at_rendezvous=any(r.where is not None and r.where.kind in ("rendezvous", "store") for r in alive),
        any_ledger=any(r.ledger for r in alive), blocked=tuple(blocked_connections(alive)),
        divergence_kind=divergence.kind if divergence is not None else None,
        in_p2p=in_p2p, p2p_deadlock=p2p_deadlock(alive), spawned=tuple(r for r in alive if spawns(r)),
        asks=rendezvous_asks(ranks), gone_joined=gone_joined(ranks, in_coll),
        in_flight=tuple((r.rank, c) for r in in_coll for c in [callsites.pending_call(r)] if c is not None and c.exc is not None),
        kept_alive=tuple(r for r in alive if r.where is not None and r.where.kind in ("thread", "child")),
        group_parted=group_parted(ranks), tag_mismatch=tag_mismatch(in_p2p), polling=polling(alive, in_coll),
        args_differ=blocked_args_differ(alive, in_coll, ranks))


def blocked_args_differ(alive: tuple[RankResult, ...], in_coll: tuple[RankResult, ...],
                        ranks: tuple[RankResult, ...]) -> ArgsDiffer | None:
    """The arguments that differ at the collective every rank is blocked in: every rank is alive and blocked in one
    collective op, its own last call record is that collective at the same call number on every rank, and those
    records' arguments that must agree differ. None otherwise (a rank gone or elsewhere, a collective no call record
    shows: DDP's from C++). The sequence numbers are not compared: each process group numbers its own collectives,
    so ranks that called one all_reduce in different groups stand at different numbers."""
    if len(alive) < 2 or len(in_coll) != len(alive) or len(alive) != len(ranks):
        return None
    if len({r.where.op for r in in_coll}) != 1:
        return None
    pending = {r.rank: callsites.pending_call(r) for r in in_coll}
    if any(c is None for c in pending.values()) or len({c.n for c in pending.values()}) != 1:
        return None
    return callsites.args_differ({k: (c,) for k, c in pending.items()})


POLL_MISSES = 3   # looks for a missing file from the code a rank stands in: a poll, not one check


def polling(alive: tuple[RankResult, ...], in_coll: tuple[RankResult, ...]) -> tuple:
    """(rank, poll) for each live rank outside torch.distributed whose stack stands at a user line of its last
    look for a file that was missing at least POLL_MISSES times (the hook's records), where every other live rank
    waits in a collective."""
    out = []
    for r in alive:
        if r in in_coll or r.where is None or r.where.kind in ("collective", "p2p", "rendezvous", "store"):
            continue
        others = [o for o in alive if o.rank != r.rank]
        if not others or any(o not in in_coll for o in others):
            continue
        here = next((f for f in r.stack if stacks.is_user_file(f.file)), None)
        p = next((p for p in sorted(r.polls, key=lambda p: -p.misses)
                  if p.misses >= POLL_MISSES and _same_function(looked_from(p), here)), None)
        if p is not None:
            out.append((r.rank, p))
    return tuple(out)


def _same_function(a, b) -> bool:
    return a is not None and b is not None and (a.file, a.func) == (b.file, b.func)


def looked_from(p) -> "stacks.Frame | None":
    """The function a poll's last look was made in: its innermost user frame that is not a comprehension or a
    lambda (``all(os.path.exists(f) for f in files)`` looks from the function that holds the generator)."""
    return next((f for f in p.user if f.func not in ("<genexpr>", "<listcomp>", "<dictcomp>", "<setcomp>", "<lambda>")),
                None)


def tag_mismatch(in_p2p: tuple[RankResult, ...]) -> tuple:
    """(sender, receiver, send tag, receive tag) for each live rank blocked in a send to a peer that is blocked in
    a receive from that rank with another tag (both tags known, peers named: the hook's answer). Peers are the
    calls' own ranks (the default group's, which are the global ranks)."""
    blocked = {r.rank: r.peer for r in in_p2p if r.peer and r.where.op in ("send", "recv")
               and r.peer.get("op") == r.where.op and isinstance(r.peer.get("tag"), int)}
    out = []
    for a, p in sorted(blocked.items()):
        q = blocked.get(p.get("peer"))
        if (p["op"] == "send" and q is not None and q["op"] == "recv" and q.get("peer") == a
                and q["tag"] != p["tag"]):
            out.append((a, p["peer"], p["tag"], q["tag"]))
    return tuple(out)


def group_parted(ranks: tuple[RankResult, ...]) -> bool:
    """The first call at which the ranks' own call records part is a new_group on some rank (the others called
    from elsewhere, or made no call), and a live rank stands in new_group."""
    if not any(r.state in ALIVE and r.where is not None and "new_group" in (r.where.op, r.where.via)
               for r in ranks):
        return False
    d = callsites.divergence({r.rank: r.calls for r in ranks}, {}, {})
    return d is not None and any(c is not None and c.op == "new_group" for c in d.first.values())




def gone_joined(ranks: tuple[RankResult, ...], in_coll: tuple[RankResult, ...]) -> bool:
    """Every rank that had exited had itself issued each collective the waiting ranks are blocked in
    (its final ledger holds the same process group, number and op): it left after taking part, not
    instead. Seen on a lossy link: rank 0 finished its last all-reduce and exited while its bytes were
    still being resent, and rank 1 waited for them. False when a ledger that would show it is missing."""
    gone = [r for r in ranks if r.state == RankState.EXITED]
    waits = [ledger_mod.pending(r.ledger or ()) for r in in_coll]
    if not gone or not waits or any(c is None for c in waits):
        return False
    for r in gone:
        issued = {(c.pg, c.seq): c.op for c in (r.ledger or ())}
        if any(issued.get((c.pg, c.seq)) != c.op for c in waits):
            return False
    return True


BLOCKING_SEND, BLOCKING_RECV = {"send", "send_object_list"}, {"recv", "recv_object_list"}


def p2p_deadlock(alive: tuple[RankResult, ...]) -> bool:
    """Every live rank is blocked in a send (or every one in a receive), each to a peer that is itself
    blocked the same way: no receive can meet a send. Needs each rank's peer (the rank hook's answer)."""
    if len(alive) < 2 or any(r.where is None or r.where.kind != "p2p" or not r.peer for r in alive):
        return False
    ops = {r.where.op for r in alive}
    if not (ops <= BLOCKING_SEND or ops <= BLOCKING_RECV):
        return False
    live = {r.rank for r in alive}
    return all(r.peer.get("peer") in live for r in alive)


def hang_signature(ranks: tuple[RankResult, ...], divergence: ledger_mod.Divergence | None) -> str:
    """The catalog entry for a job in which no rank made progress (or that was interrupted): the
    first hang rule of the catalog that holds."""
    facts = hang_facts(ranks, divergence)
    return next(s.id for s in signatures.HANG_RULES
                if s.hang_rule(facts) and not (s.rules_out is not None and s.rules_out(facts)))


def blocked_connections(ranks) -> list[tuple[int, str]]:
    """(rank, address) of each connection a rank is still opening (SYN_SENT: no answer at all, the
    mark of a firewall that drops) to an address other than its own loopback."""
    return [(r.rank, c["raddr"]) for r in ranks for c in (r.connections or ())
            if c.get("status") == "SYN_SENT" and c.get("raddr") and not c["raddr"].startswith("127.")]


def judge(evidence: Evidence) -> Verdict:
    """The verdict from the evidence, whatever the job's origin (started, attached, merged nodes)."""
    w = evidence.watch
    ev, live, ended_by = raised_before(evidence.run, w.stopped_at), evidence.live, w.ended_by
    ranks = rank_results(w.world, ended_by, w.returncode, ev, live, evidence.ledgers, w.cpu, evidence.records, w.cpu_busy)
    div = ledger_mod.divergence({r.rank: r.ledger for r in ranks if r.ledger})
    status = _status(w.ended_by, w.returncode, ev)
    # what the ranks printed with different values, read once: a fact of the verdict (a path a failing rank's file
    # lies under) and of the result (the most specific evidence that differs); the ranks that ended on their own
    # (exit 0, no error, no signal) printed less as a fact, not because they stopped
    said = printed.from_run(ev, {r.rank for r in ranks if r.exit_code == 0 and r.error is None and r.signal is None})
    signature, excerpt, first = _signature(status, ev, live, ranks, div, said)
    stall = (stall_facts(w.stall_s, w.idle_s, w.since_s, ranks, w.waited_for_timeout_s)
             if ended_by == Ending.STALL and w.stall_s is not None else None)
    stopped = (stall_facts(w.stall_s, w.idle_s, w.since_s, ranks, None)
               if ended_by in (Ending.INTERRUPT, Ending.DEADLINE) and w.stall_s is not None else None)
    if w.ranks_here is not None:
        ranks = tuple(r for r in ranks if r.rank in w.ranks_here)
    if not w.stopped:   # attached and left running: nobody sent it a signal
        ranks = tuple(replace(r, signal=None) for r in ranks)
    if evidence.nodes:  # merged from several nodes' folders
        ranks = tuple(replace(r, node=evidence.nodes.get(r.rank)) for r in ranks)
    return Verdict(status, signature, excerpt, ranks, first, div, stall, stopped=stopped, printed=said)


def _status(ended_by: Ending, returncode: int | None, ev: RunEvidence) -> Status:
    if ended_by == Ending.INTERRUPT:
        return Status.INTERRUPTED
    if ended_by in BLOCKED:
        # A rank whose uncaught exception is recorded is terminating: the job has failed, even when
        # that rank's interpreter shutdown (seen: blocked in garbage collection while its peer still
        # held the store connection) or a peer lingering in time.sleep outlasted the stall window.
        return Status.FAILED if ev.errors else Status.HUNG
    if ended_by == Ending.DEADLINE:
        return Status.DEADLINE
    if ended_by == Ending.WATCHED:  # attach: it kept making progress while watched
        return Status.RUNNING
    if ended_by == Ending.EXITED:   # attach: it ended while watched (its exit status is not ours to read)
        return Status.EXITED
    return Status.OK if returncode == 0 else Status.FAILED


def _signature(status: Status, ev: RunEvidence, live: Mapping[int, LiveRank], ranks: tuple[RankResult, ...],
               div: ledger_mod.Divergence | None, said: tuple = ()) -> tuple[str | None, str | None, int | None]:
    signature = excerpt = first = None
    if status == Status.FAILED:
        first = first_failure(ev, ranks)
        own = next((r for r in ranks if r.rank == first), None)
        signature, excerpt = failed_signature(ev, first, own.ledger if own else (), own.stack if own else (), ranks,
                                              said)
        if (signature is None or signature in signatures.GENERIC) and first in killed_from_outside(ev):
            signature = "rank-killed"
        elif signature in CONSEQUENCES and left_early(ranks, div, ev):
            # Nothing failed on its own: a rank finished (a clean exit, fewer collectives) while
            # its peer still waited in a collective, and gloo closed the peer's connection.
            signature = "rank-exited-early"
    elif status == Status.INTERRUPTED and live and waits_for_data(ranks):
        signature = "rank-waits-for-data"
    elif status == Status.HUNG or (status == Status.INTERRUPTED and live):
        signature = hang_signature(ranks, div)
    elif status == Status.DEADLINE:
        signature = "deadline-exceeded"
    return signature, excerpt, first


def waits_for_data(ranks: tuple[RankResult, ...]) -> list[int]:
    """Ranks (of a job stopped before it stalled) fetching a batch from their DataLoader while every
    other live rank waits in a collective: slow input, not a hang."""
    alive = [r for r in ranks if r.state == RankState.RUNNING and r.where is not None]
    data = [r.rank for r in alive if r.where.kind == "dataloader"]
    others = [r for r in alive if r.rank not in data]
    return data if data and others and all(r.where.kind == "collective" for r in others) else []


def left_early(ranks: tuple[RankResult, ...], div: ledger_mod.Divergence | None, ev: RunEvidence) -> list[int]:
    """Ranks that exited cleanly without issuing the collective at which the ledgers diverge."""
    if div is None or div.kind != "shorter-ledger":
        return []
    return [r.rank for r in ranks if div.ops.get(r.rank) is None and r.rank in ev.clean_exit and r.error is None]


def stall_facts(window_s: float, idle_s: float, since_s: float, ranks: tuple[RankResult, ...],
                waited_for_timeout_s: float | None) -> Stall:
    done = [ledger_mod.last_completed(r.ledger) for r in ranks if r.ledger]
    last = min(d for d in done if d is not None) if done and all(d is not None for d in done) else None
    return Stall(window_s=window_s, idle_s=round(idle_s, 1), since_s=round(since_s, 1), last_seq=last,
                 waited_for_timeout_s=waited_for_timeout_s)


# --- what the ranks' own source adds: culprits, readings that need a peer's line, the line that set it up ---
# A timeout shorter than both of torch's defaults (NCCL 10 min, gloo 30 min) was set on purpose.
SHORT_TIMEOUT_MS = 600_000
_TIMED_OUT = re.compile(r"Timed out waiting (\d+)ms|timed out after (\d+)ms|Timeout\(ms\)=(\d+)")
# The script is read as a syntax tree (engine/syntax.py), never by a pattern over its text.
# the names on a line that say nothing of which file or tensor it is about (modules, open's modes, the usual verbs)
_NOT_NAMES = frozenset({"torch", "np", "os", "open", "load", "save", "self", "json", "pickle", "rb", "wb", "r", "w",
                        "import", "time", "sleep", "with", "as", "f", "path", "data", "rand", "torch_load"})


def _env_key(n, keys=("MASTER_PORT", "MASTER_ADDR")) -> bool:
    """``os.environ["MASTER_PORT"]`` (a subscript of an environ by one of the keys)."""
    return (isinstance(n, ast.Subscript) and (syntax.dotted(n.value) or "").endswith("environ")
            and isinstance(n.slice, ast.Constant) and n.slice.value in keys)


def _sets_store_address(n) -> bool:
    """An assignment to the store's address in the environment, or a call that sets it there."""
    if isinstance(n, ast.Assign):
        return any(_env_key(t) for target in n.targets for t in ast.walk(target))
    if isinstance(n, ast.Call):
        f = n.func
        if isinstance(f, ast.Attribute) and f.attr in ("setdefault", "update") and (
                syntax.dotted(f.value) or "").endswith("environ"):
            return bool(syntax.strings(n) & {"MASTER_PORT", "MASTER_ADDR"}) or any(
                k.arg in ("MASTER_PORT", "MASTER_ADDR") for k in n.keywords)
        return syntax.called(n) == "putenv" and bool(n.args) and isinstance(n.args[0], ast.Constant) and (
            n.args[0].value in ("MASTER_PORT", "MASTER_ADDR"))
    return False


def _first_arg_starts(n, *prefixes: str) -> bool:
    return bool(n.args) and isinstance(n.args[0], ast.Constant) and isinstance(n.args[0].value, str) and (
        n.args[0].value.startswith(prefixes))


# The line a cause points at in the culprit's script, where exactly one line holds such a node: (signature id,
# a predicate over the script's syntax nodes).
SITES: dict[str, Callable[[ast.AST], bool]] = {
    "launch-local-rank-arg": lambda n: isinstance(n, ast.Call) and syntax.called(n) == "add_argument"
    and _first_arg_starts(n, "--local_rank", "--local-rank"),
    "ddp-lazy-module": lambda n: isinstance(n, ast.Call) and syntax.called(n).startswith("Lazy")
    and len(syntax.called(n)) > 4,
    "ddp-no-trainable-parameters": lambda n: (
        isinstance(n, ast.Call) and syntax.called(n) == "requires_grad_" and bool(n.args)
        and isinstance(n.args[0], ast.Constant) and n.args[0].value is False) or (
        isinstance(n, ast.Assign) and isinstance(n.value, ast.Constant) and n.value.value is False
        and any(isinstance(t, ast.Attribute) and t.attr == "requires_grad" for t in n.targets)),
    "timeout-too-short": lambda n: isinstance(n, ast.Call) and syntax.called(n) == "init_process_group"
    and any(k.arg == "timeout" for k in n.keywords),
    # a store address set in the script (premise: the ranks dial another address than torchrun gave them)
    "store-address-set": _sets_store_address,
}


def _frame_at(func: str, file: str, line: int | None, sources: Mapping[str, str]) -> stacks.Frame | None:
    return stacks.Frame(func, file, line, syntax.text_of(file, sources, line) or None) if line else None


def rank_guard(f: stacks.Frame | None, sources: Mapping[str, str]) -> stacks.Frame | None:
    """The ``if`` on the rank (``if rank == 0:``, ``if master_process:``) whose block holds the frame's line,
    within its function (``syntax.rank_if``; None: the line is under no such condition)."""
    root = syntax.tree(f.file, sources) if f is not None else None
    node = syntax.rank_if(root, f.line) if root is not None else None
    return _frame_at(f.func, f.file, node.lineno, sources) if node is not None else None


def _leaves(st: ast.stmt) -> bool:
    """A statement that leaves the loop, the function or the process: ``break``, ``return``, ``sys.exit()``,
    ``exit()``, ``quit()``."""
    if isinstance(st, (ast.Break, ast.Return)):
        return True
    return (isinstance(st, ast.Expr) and isinstance(st.value, ast.Call)
            and syntax.dotted(st.value.func) in ("sys.exit", "exit", "quit"))


def early_exit_site(file: str, sources: Mapping[str, str]) -> stacks.Frame | None:
    """The one condition on the rank in the script whose block begins by leaving (``if master_process and
    stop: break``, ``return``, ``sys.exit()``): where a rank that exited early while its peers went on left."""
    root = syntax.tree(file, sources)
    line = syntax.one_line(root, lambda n: isinstance(n, ast.If) and syntax.on_rank(n.test) and _leaves(n.body[0]))
    return _frame_at("<module>", file, line, sources)


def user_frames(r: RankResult) -> tuple[stacks.Frame, ...]:
    """Every frame of the rank's own code in its stack (innermost first), else its one frame."""
    own = tuple(f for f in (r.stack or ()) if stacks.is_user_file(f.file))
    return own or ((r.frame,) if r.frame is not None else ())


def guarded(r: RankResult, sources: Mapping[str, str]) -> stacks.Frame | None:
    """The rank condition that any of the rank's own frames (innermost first) stands under."""
    from ddplab.engine.stacks import is_user_file
    frames = [f for f in (r.stack or ()) if is_user_file(f.file)] or ([r.frame] if r.frame else [])
    return next((g for g in (rank_guard(f, sources) for f in frames) if g is not None), None)


def source_line(f: stacks.Frame | None, sources: Mapping[str, str]) -> str:
    """A frame's source line, to show: the record's own, else the script's text read at the verdict."""
    if f is None:
        return ""
    return f.text.strip() if f.text else syntax.text_of(f.file, sources, f.line)


def site(pred: Callable[[ast.AST], bool], file: str, sources: Mapping[str, str]) -> stacks.Frame | None:
    """The one line of ``file`` that holds a node ``pred`` holds for (None: no line, or more than one)."""
    return _frame_at("<module>", file, syntax.one_line(syntax.tree(file, sources), pred), sources)


_SHAPE = re.compile(r"shape=\[(\d+)")   # a recorded tensor value's shape (the hook's repr), not the script


def _batch_name(name: str) -> bool:
    return "batch" in name.lower() or name.lower() == "bs"


def batch_site(e, file: str, sources: Mapping[str, str]) -> stacks.Frame | None:
    """At an out-of-memory error: the one assignment of the script that sets a batch size (a name with "batch" in
    it, or ``bs``) to a whole-number expression (``batch_size = 8 * 512``) equal to the first dimension of a tensor
    on the failing line (its recorded values): the size that made the allocation too big (None: no such line, or
    more than one)."""
    dims = {int(m.group(1)) for v in (e.values or {}).values() for m in [_SHAPE.search(str(v))] if m}
    root = syntax.tree(file, sources)
    line = syntax.one_line(root, lambda n: isinstance(n, ast.Assign) and len(n.targets) == 1
                           and isinstance(n.targets[0], ast.Name) and _batch_name(n.targets[0].id)
                           and syntax.int_value(n.value) in dims)
    return _frame_at("<module>", file, line, sources)


def busy_peers(ranks: tuple[RankResult, ...], first: int) -> tuple[RankResult, ...]:
    """Ranks that were running the script's own code (not waiting in torch.distributed, not gone with an
    error) when ``first`` failed: their place comes from the SIGTERM dump or a live stack."""
    return tuple(r for r in ranks if r.rank != first and r.error is None and r.where is not None
                 and r.where.frame is not None
                 and r.where.kind not in ("collective", "p2p", "rendezvous", "store"))


def timed_out_ms(r: RankResult | None) -> int | None:
    """The timeout a rank's error reports (its message's milliseconds, else its pending collective's
    timeout in the ledger, for gloo's "Application timeout caused pair closure"); None: not a timeout."""
    e = r.error if r is not None else None
    if e is None:
        return None
    m = _TIMED_OUT.search(f"{e.message}\n{e.cause or ''}")
    if m:
        return int(next(g for g in m.groups() if g))
    if "Application timeout" in e.message and r.ledger:
        return r.ledger[-1].timeout_ms
    return None


def late_peers(ranks: tuple[RankResult, ...], first: int, timeout_ms: int) -> tuple[int, ...]:
    """Ranks that issued the collective ``first`` timed out in longer than the timeout after it (their
    ledgers: the same number in the same group): they were working, not stuck, while it waited."""
    own = next((r for r in ranks if r.rank == first), None)
    if own is None or not own.ledger:
        return ()
    c1 = own.ledger[-1]
    late = []
    for r in ranks:
        c0 = next((c for c in r.ledger if (c.seq, c.pg) == (c1.seq, c1.pg)), None) if r.rank != first else None
        if c0 is not None and c0.created_ns - c1.created_ns >= timeout_ms * 1_000_000:
            late.append(r.rank)
    return tuple(late)


_MISSING = re.compile(r"No such file or directory: '([^']+)'")


def missing_paths(ranks: tuple[RankResult, ...]) -> tuple[str, ...]:
    """The files the ranks' FileNotFoundErrors name (diagnose looks whether they exist at the verdict)."""
    return tuple(m.group(1) for r in ranks if r.error is not None and r.error.type == "FileNotFoundError"
                 for m in [_MISSING.search(r.error.message)] if m)


def _stands_on(f: stacks.Frame | None, sources: Mapping[str, str]) -> list[ast.AST]:
    """The syntax of the statement a frame stands on (its header, for a compound one); [] where the script does
    not parse or the line is not in it."""
    root = syntax.tree(f.file, sources) if f is not None else None
    return syntax.at_line(root, f.line) if root is not None else []


def _what_it_names(nodes: list[ast.AST]) -> set[str]:
    """What a statement is about: its names, attribute names and string constants (a path, a key), less the ones
    every such line has."""
    return (syntax.identifiers(nodes) | syntax.strings(nodes)) - _NOT_NAMES


def _writes(nodes: list[ast.AST]) -> bool:
    """A statement that writes a file: torch.save, json.dump, a DataFrame's to_csv, a download helper, open(...)
    for writing or appending."""
    for c in syntax.calls(nodes):
        name = syntax.called(c)
        if name in ("save", "dump", "to_csv", "to_parquet", "urlretrieve") or name.startswith(
                ("savez", "write", "download")):
            return True
        mode = c.args[1] if name == "open" and len(c.args) > 1 else next(
            (k.value for k in c.keywords if k.arg == "mode"), None) if name == "open" else None
        if isinstance(mode, ast.Constant) and isinstance(mode.value, str) and mode.value[:1] in ("w", "a"):
            return True
    return False


def read_before_written(ranks: tuple[RankResult, ...], first: int, sources: Mapping[str, str],
                        files: Mapping[str, float]) -> bool:
    """``first`` failed to find a file that another rank wrote: the file exists at the verdict, written
    after the failing read (``files``: {path: mtime} of the missing paths found at the verdict), or a peer
    was still on a statement that writes a file and names what the failing statement read (a name, a path)
    when torchrun ended it."""
    own = next((r for r in ranks if r.rank == first), None)
    e = own.error if own else None
    if e is None or e.type != "FileNotFoundError" or e.frame is None:
        return False
    m = _MISSING.search(e.message)
    if m and files.get(m.group(1), 0.0) >= e.time > 0:
        return True
    read = _what_it_names(_stands_on(e.frame, sources))
    for r in busy_peers(ranks, first):
        there = _stands_on(r.where.frame, sources)
        if _writes(there) and read & _what_it_names(there):
            return True
    return False


# --- the line that set a failure up, found from the cause's premise in the script (general, not per script) ---
# torch.distributed's collectives, by the called name (dist.all_reduce, torch.distributed.broadcast_object_list)
_COLLECTIVES = ("all_reduce", "all_gather", "broadcast", "reduce", "gather", "scatter", "all_to_all")
_WRAPPERS = frozenset({"DDP", "DistributedDataParallel", "FSDP", "FullyShardedDataParallel"})


def _collective_call(n) -> bool:
    if not isinstance(n, ast.Call) or not isinstance(n.func, ast.Attribute):
        return False
    owner, name = syntax.dotted(n.func.value), n.func.attr
    return owner in ("dist", "torch.distributed") and (
        name in ("barrier", "monitored_barrier") or name.startswith(_COLLECTIVES))


def unused_submodule_site(file: str, sources: Mapping[str, str]) -> stacks.Frame | None:
    """At DDP's "parameters that were not used in producing loss": the one ``self.NAME = ...(...)`` of a module's
    ``__init__`` whose NAME no other method of that class reads (a layer defined and never used in forward).
    None: no such line, or more than one."""
    tree = syntax.tree(file, sources)
    if tree is None:
        return None
    hits = []
    for cls in (n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)):
        methods = [m for m in cls.body if isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef))]
        init = next((m for m in methods if m.name == "__init__"), None)
        if init is None or not any(m.name == "forward" for m in methods):
            continue
        read = {n.attr for m in methods if m is not init for n in ast.walk(m)
                if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == "self"}
        for st in ast.walk(init):
            if isinstance(st, ast.Assign) and isinstance(st.value, ast.Call):
                for t in st.targets:
                    if (isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self"
                            and t.attr not in read):
                        hits.append(_frame_at(init.name, file, st.lineno, sources))
    return hits[0] if len(hits) == 1 else None


def batch_made_site(e, sources: Mapping[str, str]) -> stacks.Frame | None:
    """At an out-of-memory error with no batch-size constant to blame: the statement that made the failing call's
    input with a batch size of its own (``X, Y = get_batch(split, bs=len(data) // 4)``), read from the user's
    frames outermost first: the names the call on the frame's line passes, and the nearest assignment before it in
    the same function to one of them. None where that assignment passes no batch size (a keyword ``bs`` or one with
    "batch" in it)."""
    from ddplab.engine.stacks import is_user_file
    for f in reversed([f for f in (e.frames or ()) if is_user_file(f.file)]):
        root = syntax.tree(f.file, sources)
        if root is None:
            continue
        passed = set()
        for c in syntax.calls(syntax.at_line(root, f.line)):
            passed |= syntax.identifiers(list(c.args) + [k.value for k in c.keywords])
        passed -= _NOT_NAMES
        if not passed:
            continue
        before = [(st, targets) for st, targets in syntax.assignments(syntax.scope(root, f.line))
                  if st.lineno < f.line and syntax.identifiers(targets) & passed]
        if before:
            st, _ = max(before, key=lambda x: x[0].lineno)
            if any(k.arg is not None and _batch_name(k.arg) for c in syntax.calls(st.value) for k in c.keywords):
                return _frame_at(f.func, f.file, st.lineno, sources)
    return None


def guarded_collective_site(file: str, sources: Mapping[str, str]) -> stacks.Frame | None:
    """At a hang where the ranks issued different collectives and none stands under a rank condition: the one
    line of the script that issues a collective (a ``dist.`` collective, or a call of the DDP/FSDP-wrapped model,
    whose forward broadcasts buffers) under a condition on the rank: a collective only some ranks issued, which
    has returned and shifted the ranks' sequences. None: no such line, or more than one."""
    root = syntax.tree(file, sources)
    if root is None:
        return None
    wrapped = {syntax.dotted(t) for st, targets in syntax.assignments(root) for t in targets
               if isinstance(st.value, ast.Call) and syntax.called(st.value) in _WRAPPERS} - {None}
    return site(lambda n: (_collective_call(n) or isinstance(n, ast.Call) and syntax.dotted(n.func) in wrapped)
                and syntax.rank_if(root, n.lineno) is not None, file, sources)


def _loops(file: str, sources: Mapping[str, str]):
    """(first line, last line, iterates over range()) of every for loop of the script."""
    tree = syntax.tree(file, sources)
    out = []
    for n in ast.walk(tree) if tree is not None else ():
        if isinstance(n, (ast.For, ast.AsyncFor)):
            it = n.iter
            if isinstance(it, ast.Call) and getattr(it.func, "id", "") == "enumerate" and it.args:
                it = it.args[0]
            rng = isinstance(it, ast.Call) and getattr(it.func, "id", "") == "range"
            out.append((n.lineno, n.end_lineno or n.lineno, rng))
    return out


def uneven_loop_site(ranks: tuple[RankResult, ...], sources: Mapping[str, str]) -> stacks.Frame | None:
    """At a hang where the ranks issued different collectives: one rank has left a loop (its frame in a
    function stands after the loop) that another rank is still in, and that rank is inside a loop over data (a
    ``for`` over something other than range()): the ranks ran a different number of batches. The number of
    batches is the sampler's: the one sampler made in the script (a call of a class named ``...Sampler``). None
    where the premise or the line is missing."""
    from ddplab.engine.stacks import is_user_file
    alive = [r for r in ranks if r.state in ALIVE and r.stack]
    for behind in alive:
        own = [f for f in behind.stack if is_user_file(f.file)]
        loops = {f.file: _loops(f.file, sources) for f in own}
        in_data = any(a <= f.line <= b and not rng for f in own for a, b, rng in loops[f.file])
        if not in_data:
            continue
        for ahead in alive:
            if ahead is behind:
                continue
            for g in (f for f in ahead.stack if is_user_file(f.file)):
                f = next((f for f in own if (f.file, f.func) == (g.file, g.func)), None)
                if f is not None and any(a <= f.line <= b < g.line for a, b, _ in loops[f.file]):
                    return site(lambda n: isinstance(n, ast.Call) and syntax.called(n).endswith("Sampler"),
                                f.file, sources)
    return None


_P2P_BYTES = re.compile(r"op\.preamble\.length <= op\.nbytes\. (\d+) vs (\d+)")   # gloo's message
_ELEMENT_BYTES = {"float64": 8, "double": 8, "int64": 8, "long": 8, "float16": 2, "half": 2, "bfloat16": 2,
                  "int8": 1, "uint8": 1, "bool": 1}


def _alloc_bytes(n, consts: Mapping[str, int]) -> int | None:
    """The bytes ``torch.empty(...)``/``torch.zeros(...)`` allocates, from its sizes (whole-number expressions of
    constants and the script's constants) and its dtype (4 bytes when none is given); None for anything else."""
    import math
    n = next((c for c in (ast.walk(n) if n is not None else ()) if isinstance(c, ast.Call)
              and syntax.dotted(c.func) in ("torch.empty", "torch.zeros")), None)   # torch.empty(4).to(device)
    if n is None:
        return None
    dims = []
    for a in n.args:
        for x in (a.elts if isinstance(a, (ast.Tuple, ast.List)) else [a]):
            v = syntax.int_value(x, consts)
            if v is None:
                return None
            dims.append(v)
    dtype = next((k.value for k in n.keywords if k.arg == "dtype"), None)
    size = _ELEMENT_BYTES.get(syntax.called(dtype) if dtype is not None else "", 4)
    return math.prod(dims) * size if dims else None


def _derived_from(call: ast.Call, root: ast.AST, hops: int = 4) -> set[str]:
    """The names a send's tensor comes from in the script: the variables its call passes, and, a few assignments
    or appends back (``x = ...``, ``inputs.append(x)``), the variables those read."""
    found = syntax.names(list(call.args) + [k.value for k in call.keywords])
    for _ in range(hops):
        more = set(found)
        for n in ast.walk(root):
            if isinstance(n, ast.Assign) and len(n.targets) == 1 and isinstance(n.targets[0], ast.Name) and (
                    n.targets[0].id in found):
                more |= syntax.names(n.value)
            elif (isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr in ("append", "extend")
                  and isinstance(n.func.value, ast.Name) and n.func.value.id in found):
                more |= syntax.names(list(n.args))
        if more == found:
            break
        found = more
    return found


def _receives_into(n, name: str) -> bool:
    """A ``recv``/``irecv`` whose buffer is the variable ``name``."""
    return (isinstance(n, ast.Call) and syntax.called(n) in ("recv", "irecv") and bool(n.args)
            and isinstance(n.args[0], ast.Name) and n.args[0].id == name)


def p2p_sent_site(ranks: tuple[RankResult, ...], first: int, sources: Mapping[str, str]):
    """At a receive that got more bytes than its buffer (gloo's "N vs M"): the peer that was sending to it, and
    the one receive buffer of the script whose size is what that peer sent (an empty tensor a recv fills: the
    peer's tensor was made from a receive of the wrong size upstream, not computed at that size). (culprits,
    line); ((), None) where the log names no sizes, no peer stood at a send, or not exactly one receive buffer
    has the sent size (then which side's shape is wrong is not in the evidence)."""
    own = next((r for r in ranks if r.rank == first), None)
    m = _P2P_BYTES.search((own.log_tail or "") if own is not None else "")
    if own is None or m is None:
        return (), None
    got = int(m.group(1))
    senders = []
    for r in ranks:
        if r.rank == first:
            continue
        frames = [f for f in ((r.error.frames if r.error else ()) or r.stack or ()) if f.file in sources]
        send = next((c for c in syntax.calls(_stands_on(frames[0], sources)) if syntax.called(c) in ("send", "isend")),
                    None) if frames else None
        if send is not None:
            senders.append((r.rank, frames[0], send))
    if not senders:
        return (), None
    file = senders[0][1].file
    root = syntax.tree(file, sources)
    sent = _derived_from(senders[0][2], root)
    consts = syntax.constants(root)
    # a receive buffer (an empty tensor a recv fills on the next three lines) of the size the peer sent
    hits = sorted({n.lineno for n in ast.walk(root) if isinstance(n, ast.Assign) and len(n.targets) == 1
                   and isinstance(n.targets[0], ast.Name) and n.targets[0].id in sent
                   and _alloc_bytes(n.value, consts) == got
                   and any(_receives_into(c, n.targets[0].id) and n.lineno < c.lineno <= n.lineno + 3
                           for c in ast.walk(root))})
    if len(hits) == 1:
        return tuple(sorted({k for k, _, _ in senders})), _frame_at("<module>", file, hits[0], sources)
    return receiver_buffer_site(own, int(m.group(2)), sources)


def receiver_buffer_site(own: RankResult, expected: int, sources: Mapping[str, str]):
    """The other reading of a receive that got another size: no buffer upstream of the peer's tensor has the
    size it sent (the peer sent what it computed), so the receive buffer is the one to match it: the empty
    tensor the failing recv fills, made in its function with the size the receive expected. ((rank,), line);
    ((), None) where the recv's buffer is not such an allocation."""
    f = own.frame
    root = syntax.tree(f.file, sources) if f is not None else None
    if root is None:
        return (), None
    recv = next((c for c in syntax.calls(syntax.at_line(root, f.line)) if syntax.called(c) in ("recv", "irecv")
                 and c.args and isinstance(c.args[0], ast.Name)), None)
    if recv is None:
        return (), None
    name = recv.args[0].id
    before = [st for st, targets in syntax.assignments(syntax.scope(root, f.line))
              if st.lineno < f.line and any(isinstance(t, ast.Name) and t.id == name for t in targets)]
    if not before:
        return (), None
    st = max(before, key=lambda s: s.lineno)
    if _alloc_bytes(getattr(st, "value", None), syntax.constants(root)) == expected:
        return (own.rank,), _frame_at(f.func, f.file, st.lineno, sources)
    return (), None


def refine(v: Verdict, sources: Mapping[str, str], files: Mapping[str, float] | None = None) -> Verdict:
    """The verdict with what the culprit ranks' own source lines add (``sources``: {file: text} of the
    user files the ranks' frames name, read at the verdict; ``files``: {path: mtime} of the files the
    ranks' FileNotFoundErrors name that exist at the verdict): readings whose premise needs a peer's line
    or a file written later (a timeout shorter than a peer's work; a read of a file a peer had not yet
    written), the ranks the evidence blames, and the one line of the culprit's script that set the
    failure up. Pure."""
    files = files or {}
    sig, first, ranks = v.signature, v.first_failure, v.ranks
    culprits: tuple[int, ...] = ()
    guard = None
    # where the ranks' own call sites part (the rank hook's records), and the user's branch between
    parted = callsites.divergence({r.rank: r.calls for r in ranks}, {r.rank: user_frames(r) for r in ranks}, sources)
    if v.status == Status.FAILED and first is not None:
        own = next((r for r in ranks if r.rank == first), None)
        ms = timed_out_ms(own)
        if (sig == "collective-timeout" and ms is not None and ms < SHORT_TIMEOUT_MS
                and (busy_peers(ranks, first) or late_peers(ranks, first, ms))):
            sig = "timeout-too-short"
        elif sig in signatures.GENERIC and read_before_written(ranks, first, sources, files):
            sig = "read-before-write"
        culprits = (first,)
        a = init_asks(ranks) if sig == "rendezvous-timeout" else None
        if a is not None and a.duplicates:
            # the rendezvous timed out because two processes asked for one rank, not because a rank
            # was missing: every process reached init_process_group (each recorded what it asked for)
            sig = "rendezvous-ranks-conflict"
            culprits = tuple(sorted(p for p, (rank, _) in a.by_process.items() if rank is not None and rank != p))
        if sig == "rank-exited-early":
            early = tuple(r.rank for r in ranks if r.state == RankState.EXITED and r.exit_code == 0 and r.error is None)
            culprits = early or culprits
    elif v.status == Status.HUNG:
        a = rendezvous_asks(ranks)
        if sig == "rendezvous-ranks-conflict" and a is not None and a.duplicates:
            # the processes that asked for a rank other than the one torchrun gave them
            culprits = tuple(sorted(p for p, (rank, _) in a.by_process.items() if rank is not None and rank != p))
        elif sig == "file-handshake-deadlock":
            # the ranks polling for a file (the hook's records), at the line of their last look
            polls = hang_facts(ranks, v.divergence).polling   # the facts the rule held on
            culprits = tuple(k for k, _ in polls)
            guard = next((looked_from(p) for _, p in polls), None)
            if guard is not None and not guard.text:
                guard = replace(guard, text=source_line(guard, sources) or None)
        elif sig == "non-daemon-thread":
            # the ranks a thread keeps alive, and the user's line that started that thread (the hook's record)
            kept = [r for r in ranks if r.state in ALIVE and r.where is not None and r.where.kind == "thread"]
            culprits = tuple(r.rank for r in kept)
            guard = next((t.started for r in kept for t in r.threads
                          if t.name == r.where.op and t.started is not None), None)
            if guard is not None and not guard.text:
                guard = replace(guard, text=source_line(guard, sources) or None)
        elif sig in ("collective-root-differs", "collective-group-differs"):
            culprits, guard = args_culprits(hang_facts(ranks, v.divergence).args_differ)   # the fact the rule held on
            if guard is not None and not guard.text:
                guard = replace(guard, text=source_line(guard, sources) or None)
        elif sig in ("hang-different-collectives", "hang-rank-elsewhere", "hang-different-sizes",
                     "new-group-on-some-ranks"):
            # the ranks that stand under a condition on the rank while the others do not: a collective
            # (or the work before one) that only some ranks reach
            alive = [r for r in ranks if r.state in ALIVE]
            if parted is not None and parted.odd and parted.branch is not None:
                # the ranks whose call stands under a condition the others' calls do not: from the call sites
                culprits, guard = parted.odd, parted.branch
                odd_call = parted.first.get(parted.odd[0])
                if sig == "new-group-on-some-ranks" and odd_call is not None and odd_call.frame is not None:
                    # the new_group only those ranks made: the call to move out of the condition
                    guard = replace(odd_call.frame, text=odd_call.frame.text or source_line(odd_call.frame, sources) or None)
            elif not any(r.calls for r in alive):
                # no call records (a job ddplab did not start, an older run folder): the rank condition over
                # the script's text, the reading before issue 41
                under = {r.rank: guarded(r, sources) for r in alive}
                odd = tuple(k for k, g in under.items() if g is not None)
                if odd and len(odd) < len(alive):
                    culprits = odd
                    guard = under[odd[0]]
    fix_at = None
    where = next((r for r in ranks if r.rank in culprits), None) if culprits else next(
        (r for r in ranks if r.state in ALIVE), None)
    frame = where.frame if where is not None else None
    key = sig
    if sig in ("hang-rendezvous", "store-unreachable", "rendezvous-timeout") and any(
            r.dialling and r.given and r.dialling.get("port") != r.given.get("port") for r in ranks):
        key = "store-address-set"
    if frame is not None and key in SITES:
        fix_at = site(SITES[key], frame.file, sources)
    elif sig == "rank-exited-early" and v.first_failure is not None:
        # the early rank left no frame (a clean exit): its peer's script is the same file
        peer = next((r for r in ranks if r.rank == v.first_failure), None)
        if peer is not None and peer.frame is not None:
            fix_at = early_exit_site(peer.frame.file, sources)
    elif frame is not None and sig in ("cpu-oom", "cuda-oom") and where.error is not None:
        fix_at = batch_site(where.error, frame.file, sources)
    if fix_at is None and guard is not None:
        fix_at = guard
    if (fix_at is None and v.status == Status.FAILED and where is not None and where.error is not None
            and where.error.nested is not None):
        # raised in another process (a DataLoader worker) and re-raised in the rank: the line to fix is the
        # other process's own (its traceback, the hook's record), not the rank's loop over the loader
        fix_at = next((f for f in where.error.nested.frames if stacks.is_user_file(f.file)), None)
        if fix_at is not None and not fix_at.text:
            fix_at = replace(fix_at, text=source_line(fix_at, sources) or None)
    if fix_at is None and frame is not None and sig == "unused-parameters":
        fix_at = unused_submodule_site(frame.file, sources)
    elif fix_at is None and frame is not None and sig in ("cpu-oom", "cuda-oom") and where.error is not None:
        fix_at = batch_made_site(where.error, sources)
    elif (fix_at is None and v.status == Status.HUNG and not culprits and frame is not None
          and sig in ("hang-different-collectives", "hang-rank-elsewhere", "hang-different-sizes")):
        fix_at = guarded_collective_site(frame.file, sources) or uneven_loop_site(ranks, sources)
    elif v.status == Status.FAILED and sig == "p2p-size-mismatch" and first is not None:
        senders, at = p2p_sent_site(ranks, first, sources)
        if at is not None:
            culprits, fix_at = senders, at
    return replace(v, signature=sig, culprits=culprits, fix_at=fix_at, calls_diverged=parted,
                   args_differ=callsites.args_differ({r.rank: r.calls for r in ranks}))


def args_culprits(d: ArgsDiffer | None) -> tuple[tuple[int, ...], stacks.Frame | None]:
    """For a collective whose arguments differ across the ranks blocked in it (``HangFacts.args_differ``): the ranks
    that passed a value fewer ranks passed than the most common one (``ArgsDiffer.minority``: () when no value is the
    most common), and the call's line when every rank called from the same one (the argument to fix is on it)."""
    if d is None:
        return (), None
    lines = {(f.file, f.line) for _, f in d.frames if f is not None}
    line = next((f for _, f in d.frames if f is not None), None) if len(lines) == 1 and len(d.frames) == len(
        [f for _, f in d.frames if f is not None]) else None
    return d.minority, line
