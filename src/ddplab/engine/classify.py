"""Classification: one pure function, ``judge(Evidence) -> Verdict`` (status, signature, stall
facts, per-rank facts, the first failure, the divergence), for a job ddplab started, one it
attached to, and the merged folders of several nodes alike.

No I/O and no clock here: everything comes in as data (``evidence.Evidence``: what the watch loop
saw, the live ranks captured at the verdict, what the ranks left behind), so every rule is tested
on evidence captured from real runs. Sentences are made later, by ``ddplab.views.render``.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Mapping

from ddplab.engine import ledger as ledger_mod
from ddplab.engine import callsites, printed, signatures, stacks
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
# a line that writes a file (torch.save, json.dump, open(..., "w"), a download helper)
_WRITES = re.compile(r"\b(?:save|savez\w*|dump|write\w*|to_csv|to_parquet|download\w*|urlretrieve)\("
                     r"|open\(.*['\"][wa]b?['\"]")
_NOT_NAMES = frozenset({"torch", "np", "os", "open", "load", "save", "self", "json", "pickle", "rb", "wb", "r", "w",
                        "import", "time", "sleep", "with", "as", "f", "path", "data", "rand", "torch_load"})
# The line a cause points at in the culprit's script, where exactly one line matches: (signature id, regex).
SITES: dict[str, str] = {
    "launch-local-rank-arg": r"add_argument\(\s*['\"]--local[_-]rank",
    "ddp-lazy-module": r"\bLazy\w+\(",
    "ddp-no-trainable-parameters": r"requires_grad_\(\s*False\s*\)|\.requires_grad\s*=\s*False",
    "timeout-too-short": r"init_process_group\(.*\btimeout\s*=",
    # a store address set in the script (premise: the ranks dial another address than torchrun gave them)
    "store-address-set": r"environ\[\s*['\"]MASTER_(?:PORT|ADDR)['\"]\s*\]\s*[,=]|"
                         r"environ\.(?:setdefault|update)\(.*MASTER_(?:PORT|ADDR)|putenv\(\s*['\"]MASTER_(?:PORT|ADDR)",
}


_RANK_GUARD = re.compile(r"^\s*(?:el)?if\b.*\b(?:\w*rank\w*|master_process|is_main_process|is_master|main_process)\b")
_HEADER = re.compile(r"^\s*(?:async\s+)?(?:def|class)\b")


def rank_guard(f: stacks.Frame | None, sources: Mapping[str, str]) -> stacks.Frame | None:
    """The ``if`` on the rank (``if rank == 0:``, ``if master_process:``) whose block holds the frame's line,
    within its function, from the script's text (None: the line is under no such condition)."""
    if f is None:
        return None
    lines = (sources.get(f.file) or "").splitlines()
    if not 0 < f.line <= len(lines):
        return None
    indent = len(lines[f.line - 1]) - len(lines[f.line - 1].lstrip())
    for j in range(f.line - 2, -1, -1):
        t = lines[j]
        if not t.strip() or t.lstrip().startswith("#"):
            continue
        ind = len(t) - len(t.lstrip())
        if ind >= indent:
            continue
        indent = ind
        if _RANK_GUARD.match(t):
            return stacks.Frame(f.func, f.file, j + 1, t.strip())
        if _HEADER.match(t) or ind == 0:
            return None
    return None


_LEAVES = re.compile(r"^\s*(?:break|return\b.*|(?:sys\.)?exit\(.*\)|quit\(\))\s*(?:#.*)?$")


def early_exit_site(file: str, sources: Mapping[str, str]) -> stacks.Frame | None:
    """The one condition on the rank in the script whose block begins by leaving (``if master_process and
    stop: break``, ``return``, ``sys.exit()``): where a rank that exited early while its peers went on left."""
    lines = (sources.get(file) or "").splitlines()
    hits = []
    for i, t in enumerate(lines):
        if not _RANK_GUARD.match(t):
            continue
        head, _, tail = t.partition(":")
        body = tail.split("#", 1)[0].strip()
        nxt = next((x for x in lines[i + 1:] if x.strip() and not x.lstrip().startswith("#")), "")
        if (body and _LEAVES.match(body)) or (not body and _LEAVES.match(nxt)):
            hits.append(stacks.Frame("<module>", file, i + 1, t.strip()))
    return hits[0] if len(hits) == 1 else None


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
    """A frame's source line: the record's own, else the script's text read at the verdict."""
    if f is None:
        return ""
    if f.text:
        return f.text.strip()
    lines = (sources.get(f.file) or "").splitlines()
    return lines[f.line - 1].strip() if 0 < f.line <= len(lines) else ""


def site(pattern: str, file: str, sources: Mapping[str, str]) -> stacks.Frame | None:
    """The one line of ``file`` that matches ``pattern`` (None: no line, or more than one)."""
    rx = re.compile(pattern)
    hits = [(i + 1, t) for i, t in enumerate((sources.get(file) or "").splitlines())
            if rx.search(t) and not t.lstrip().startswith("#")]
    return stacks.Frame("<module>", file, hits[0][0], hits[0][1].strip()) if len(hits) == 1 else None


_BATCH_NAME = re.compile(r"^\s*(\w*(?:batch\w*|\bbs))\s*=\s*([\d\s*+()]+?)\s*(?:#.*)?$", re.I)
_SHAPE = re.compile(r"shape=\[(\d+)")


def _number(expr: str) -> int | None:
    """The value of a constant product or sum of whole numbers (``8 * 512``), without evaluating code."""
    import ast

    def val(n):
        if isinstance(n, ast.Constant) and isinstance(n.value, int):
            return n.value
        if isinstance(n, ast.BinOp) and isinstance(n.op, (ast.Mult, ast.Add)):
            a, b = val(n.left), val(n.right)
            return None if a is None or b is None else (a * b if isinstance(n.op, ast.Mult) else a + b)
        return None
    try:
        return val(ast.parse(expr.strip(), mode="eval").body)
    except SyntaxError:
        return None


def batch_site(e, file: str, sources: Mapping[str, str]) -> stacks.Frame | None:
    """At an out-of-memory error: the one line of the script that sets a batch size to a number (``batch_size =
    8 * 512``) equal to the first dimension of a tensor on the failing line (its recorded values): the size
    that made the allocation too big (None: no such line, or more than one)."""
    dims = {int(m.group(1)) for v in (e.values or {}).values() for m in [_SHAPE.search(str(v))] if m}
    hits = []
    for i, t in enumerate((sources.get(file) or "").splitlines()):
        m = _BATCH_NAME.match(t)
        if m:
            n = _number(m.group(2))
            if n in dims:
                hits.append(stacks.Frame("<module>", file, i + 1, t.strip()))
    return hits[0] if len(hits) == 1 else None


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


def read_before_written(ranks: tuple[RankResult, ...], first: int, sources: Mapping[str, str],
                        files: Mapping[str, float]) -> bool:
    """``first`` failed to find a file that another rank wrote: the file exists at the verdict, written
    after the failing read (``files``: {path: mtime} of the missing paths found at the verdict), or a peer
    was still on a line that writes and names what the failing line read when torchrun ended it."""
    own = next((r for r in ranks if r.rank == first), None)
    e = own.error if own else None
    if e is None or e.type != "FileNotFoundError" or e.frame is None:
        return False
    m = _MISSING.search(e.message)
    if m and files.get(m.group(1), 0.0) >= e.time > 0:
        return True
    read = set(re.findall(r"[A-Za-z_]\w*", source_line(e.frame, sources))) - _NOT_NAMES
    for r in busy_peers(ranks, first):
        line = source_line(r.where.frame, sources)
        if _WRITES.search(line) and read & set(re.findall(r"[A-Za-z_]\w*", line)):
            return True
    return False


# --- the line that set a failure up, found from the cause's premise in the script (general, not per script) ---
_COLLECTIVE_CALL = re.compile(r"\b(?:dist|torch\.distributed)\.(?:all_reduce|all_gather\w*|broadcast\w*|reduce\w*|"
                              r"gather\w*|scatter\w*|barrier|all_to_all\w*|monitored_barrier)\(")
_DDP_WRAP = re.compile(r"^\s*([\w.]+)\s*=\s*(?:\w+\.)*(?:DDP|DistributedDataParallel|FSDP|FullyShardedDataParallel)\(")
_SAMPLER = re.compile(r"\b\w*Sampler\(")


def _tree(file: str, sources: Mapping[str, str]):
    import ast
    try:
        return ast.parse(sources.get(file) or "")
    except (SyntaxError, ValueError):
        return None


def unused_submodule_site(file: str, sources: Mapping[str, str]) -> stacks.Frame | None:
    """At DDP's "parameters that were not used in producing loss": the one ``self.NAME = ...(...)`` of a module's
    ``__init__`` whose NAME no other method of that class reads (a layer defined and never used in forward).
    None: no such line, or more than one."""
    import ast
    tree = _tree(file, sources)
    if tree is None:
        return None
    lines = (sources.get(file) or "").splitlines()
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
                        hits.append(stacks.Frame(init.name, file, st.lineno, lines[st.lineno - 1].strip()))
    return hits[0] if len(hits) == 1 else None


def _function_start(lines: list[str], line: int) -> int:
    """The 1-based line of the ``def`` that holds ``line`` (1 at module level)."""
    indent = len(lines[line - 1]) - len(lines[line - 1].lstrip())
    for j in range(line - 2, -1, -1):
        t = lines[j]
        if t.strip() and len(t) - len(t.lstrip()) < indent and _HEADER.match(t):
            return j + 1
    return 1


_BATCH_ARG = re.compile(r"\b(?:bs|batch_size|\w*batch\w*)\s*=[^=]")


def batch_made_site(e, sources: Mapping[str, str]) -> stacks.Frame | None:
    """At an out-of-memory error with no batch-size constant to blame: the line that made the failing call's
    input with a batch size of its own (``X, Y = get_batch(split, bs=len(data) // 4)``), read from the user's
    frames outermost first: the call's argument names, and the nearest line before it in the same function that
    assigns one of them. None where that line sets no batch size."""
    from ddplab.engine.stacks import is_user_file
    for f in reversed([f for f in (e.frames or ()) if is_user_file(f.file)]):
        lines = (sources.get(f.file) or "").splitlines()
        if not 0 < f.line <= len(lines):
            continue
        call = lines[f.line - 1]
        args = call[call.find("(") + 1:] if "(" in call else ""
        names = set(re.findall(r"\b[A-Za-z_]\w*\b", args)) - _NOT_NAMES
        if not names:
            continue
        for j in range(f.line - 1, _function_start(lines, f.line) - 1, -1):
            t = lines[j - 1]
            m = re.match(r"^\s*([\w\s,.*]+?)\s*=[^=]", t)
            if m and names & set(re.findall(r"\w+", m.group(1))):
                if _BATCH_ARG.search(t[m.end() - 1:]):
                    return stacks.Frame(f.func, f.file, j, t.strip())
                break
    return None


def guarded_collective_site(file: str, sources: Mapping[str, str]) -> stacks.Frame | None:
    """At a hang where the ranks issued different collectives and none stands under a rank condition: the one
    line of the script that issues a collective (a ``dist.`` collective, or a call of the DDP/FSDP-wrapped model,
    whose forward broadcasts buffers) under a condition on the rank: a collective only some ranks issued, which
    has returned and shifted the ranks' sequences. None: no such line, or more than one."""
    lines = (sources.get(file) or "").splitlines()
    wrapped = {m.group(1) for t in lines for m in [_DDP_WRAP.match(t)] if m}
    calls = [re.compile(rf"(?<![\w.]){re.escape(w)}\(") for w in wrapped]
    hits = []
    for i, t in enumerate(lines):
        if t.lstrip().startswith("#") or not (_COLLECTIVE_CALL.search(t) or any(c.search(t) for c in calls)):
            continue
        if rank_guard(stacks.Frame("", file, i + 1, t.strip()), sources) is not None:
            hits.append(stacks.Frame("<module>", file, i + 1, t.strip()))
    return hits[0] if len(hits) == 1 else None


def _loops(file: str, sources: Mapping[str, str]):
    """(first line, last line, iterates over range()) of every for loop of the script."""
    import ast
    tree = _tree(file, sources)
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
    batches is the sampler's: the one sampler made in the script. None where the premise or the line is missing."""
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
                    return site(_SAMPLER.pattern, f.file, sources)
    return None


_P2P_BYTES = re.compile(r"op\.preamble\.length <= op\.nbytes\. (\d+) vs (\d+)")
_BUFFER = re.compile(r"\btorch\.(?:empty|zeros)\(([^()]*)\)")
_ELEMENT_BYTES = {"float64": 8, "double": 8, "int64": 8, "long": 8, "float16": 2, "half": 2, "bfloat16": 2,
                  "int8": 1, "uint8": 1, "bool": 1}


def _constants(file: str, sources: Mapping[str, str]) -> dict[str, int]:
    """The script's module-level whole-number constants (``WIDTH, MICRO = 16, 4``)."""
    import ast
    tree = _tree(file, sources)
    out: dict[str, int] = {}
    for st in (tree.body if tree is not None else ()):
        if isinstance(st, ast.Assign) and len(st.targets) == 1:
            t, v = st.targets[0], st.value
            pairs = (zip(t.elts, v.elts) if isinstance(t, ast.Tuple) and isinstance(v, ast.Tuple)
                     and len(t.elts) == len(v.elts) else [(t, v)])
            for a, b in pairs:
                if isinstance(a, ast.Name) and isinstance(b, ast.Constant) and type(b.value) is int:
                    out[a.id] = b.value
    return out


def _alloc_bytes(args: str, consts: dict[str, int]) -> int | None:
    import math
    parts = [p.strip() for p in args.split(",") if p.strip()]
    dims, size = [], 4
    for p in parts:
        if "=" in p:
            k, _, v = p.partition("=")
            if k.strip() == "dtype":
                size = _ELEMENT_BYTES.get(v.strip().rsplit(".", 1)[-1], 4)
            continue
        expr = re.sub(r"\b[A-Za-z_]\w*\b", lambda m: str(consts[m.group(0)]) if m.group(0) in consts else "x", p)
        try:
            n = _number(expr) if "x" not in expr else None
        except (ValueError, TypeError):
            n = None
        if n is None:
            return None
        dims.append(n)
    return math.prod(dims) * size if dims else None


_ROOT_NAME = re.compile(r"(?<![.\w])([A-Za-z_]\w*)\b(?!\s*=[^=])")


def _derived_from(line: str, text: str, hops: int = 4) -> set[str]:
    """The names a send's tensor comes from in the script: the names on its line (not attributes, not keyword
    names), and, a few assignments or appends back (``x = ...``, ``inputs.append(x)``), the names those read."""
    call = line[line.find("(") + 1:] if "(" in line else line
    names = set(_ROOT_NAME.findall(call))
    for _ in range(hops):
        more = set(names)
        for t in (x.split("#", 1)[0] for x in text.splitlines()):
            m = re.match(r"^\s*(\w+)\s*=([^=].*)$", t) or re.match(r"^\s*(\w+)\.(?:append|extend)\((.*)\)", t)
            if m and m.group(1) in names:
                more |= set(_ROOT_NAME.findall(m.group(2)))
        if more == names:
            break
        names = more
    return names


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
        if frames and re.search(r"\b(?:dist\.)?i?send\(", source_line(frames[0], sources)):
            senders.append((r.rank, frames[0]))
    if not senders:
        return (), None
    file = senders[0][1].file
    sent = _derived_from(source_line(senders[0][1], sources), sources.get(file) or "")
    consts = _constants(file, sources)
    lines = (sources.get(file) or "").splitlines()
    hits = []
    for i, t in enumerate(lines):
        a, name = _BUFFER.search(t), re.match(r"^\s*(\w+)\s*=", t)
        # a receive buffer (an empty tensor a recv fills on the next lines) of the size the peer sent
        if a and name and name.group(1) in sent and _alloc_bytes(a.group(1), consts) == got and any(
                re.search(rf"\bi?recv\(\s*{name.group(1)}\b", x) for x in lines[i + 1:i + 4]):
            hits.append(stacks.Frame("<module>", file, i + 1, t.strip()))
    if len(hits) == 1:
        return tuple(sorted({k for k, _ in senders})), hits[0]
    return receiver_buffer_site(own, int(m.group(2)), sources)


def receiver_buffer_site(own: RankResult, expected: int, sources: Mapping[str, str]):
    """The other reading of a receive that got another size: no buffer upstream of the peer's tensor has the
    size it sent (the peer sent what it computed), so the receive buffer is the one to match it: the empty
    tensor the failing recv fills, made in its function with the size the receive expected. ((rank,), line);
    ((), None) where the recv's buffer is not such an allocation."""
    f = own.frame
    lines = (sources.get(f.file) or "").splitlines() if f is not None else []
    if not 0 < (f.line if f else 0) <= len(lines):
        return (), None
    m = re.search(r"\bi?recv\(\s*(\w+)\b", lines[f.line - 1])
    if m is None:
        return (), None
    consts = _constants(f.file, sources)
    for j in range(f.line - 1, _function_start(lines, f.line) - 1, -1):
        t = lines[j - 1].split("#", 1)[0]
        if re.match(rf"^\s*{m.group(1)}\s*=[^=]", t):
            a = _BUFFER.search(t)
            if a and _alloc_bytes(a.group(1), consts) == expected:
                return (own.rank,), stacks.Frame(f.func, f.file, j, lines[j - 1].strip())
            return (), None
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
