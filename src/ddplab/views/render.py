"""Rendering: sentences made from a result's fields, only when shown (text, HTML, the live status line).

Nothing here is parsed back: tests and notebooks read the fields of ``RunResult`` and
``RankResult``; these functions are the views for people.
"""
from __future__ import annotations

import html as _html
from pathlib import Path
from typing import TYPE_CHECKING

from ddplab.engine import groups, libraries, waits
from ddplab.defaults import ALIVE, RankState, Status
from ddplab.facts import is_user_file, numel, short_path
from ddplab.spans import label
from ddplab.views.render_check import check_html, check_lines
from ddplab.views.render_printed import printed_sentence

if TYPE_CHECKING:  # pragma: no cover
    from ddplab.result import RankResult, RunResult
    from ddplab.facts import Where
    from ddplab.result import Snapshot

# Who issued a collective the user never called by name.
VIA = {
    "ddp-backward": "DDP gradients, inside backward",
    "ddp-forward-buffers": "DDP buffer sync, inside forward",
    "ddp-forward-rebuild-buckets": "DDP bucket rebuild, inside forward",
    "ddp-construct": "DDP construction",
    "join": "Join",
    "init_process_group": "rendezvous",
}
# What a rank outside any collective is doing.
KIND_PHRASE = {
    "sleep": "sleeping (time.sleep)",
    "socket": "waiting on a socket",
    "dataloader": "waiting for its DataLoader",
    "lock": "waiting on a lock",
    "store": "waiting on the TCPStore",
    "rendezvous": "waiting at the rendezvous",
    "compute": "computing",
}


def _via(via: str | None) -> str | None:
    """Who issued a collective, in words: DDP's own calls, or the object collective around it."""
    if via in VIA and via != "init_process_group":
        return VIA[via]
    return f"inside {via}" if via and via.endswith(("_object", "_object_list")) else None


def wait_phrase(w: "Where | None") -> str | None:
    """What a rank is blocked in, in a few words: "barrier", "all_reduce (DDP gradients, inside backward)"."""
    if w is None:
        return None
    if w.kind == "collective":
        return f"{w.op} ({_via(w.via)})" if _via(w.via) else w.op
    if w.kind == "p2p":
        return f"{w.op} (point-to-point" + (f", inside {w.via})" if w.via else ")")
    if w.kind == "rendezvous":
        return f"{w.op} (rendezvous)"
    if w.kind == "store":
        return f"{w.op} (the TCPStore)"
    if w.kind in ("sleep", "socket", "dataloader", "lock"):
        return f"{w.op}" if w.op else w.kind
    return None


class Paths:
    """A file's path in full (relative to the working folder where it can be) the first time a view
    names it, and its base name after that."""

    def __init__(self):
        self.seen: set[str] = set()

    def at(self, r: "RankResult") -> str:
        f = r.frame
        if f is None:
            return ""
        if f.file in self.seen:
            return f" at {Path(f.file).name}:{f.line} in {f.func}"
        self.seen.add(f.file)
        return f" at {f.short()}"


def state_phrase(r: "RankResult", paths: "Paths | None" = None) -> str:
    """One rank's state at the end of the run, without its number: "in barrier #21 at train.py:16 in main"."""
    at = (paths or Paths()).at(r)
    w = r.where
    if r.state in ALIVE and w is not None:
        if w.kind == "collective":
            seq = f" #{w.seq}" if w.seq is not None else ""
            pend = next((c for c in reversed(r.ledger) if c.seq == w.seq and not c.completed), None) if w.seq else None
            size = f" of {pend.numel} elements" if pend is not None and pend.sizes else ""
            via = f" ({_via(w.via)})" if _via(w.via) else ""
            return f"in {w.op}{seq}{size}{via}{library_phrase(w)}{at}"
        if w.kind == "p2p":       # its peer is in p2p_sentence: a group's ranks have different peers
            via = f" (inside {w.via})" if w.via else ""
            return f"in {w.op}{via}, a point-to-point call{library_phrase(w)}{at}"
        if w.kind == "rendezvous" or w.kind == "store":
            to = ""
            if r.dialling and r.dialling.get("host"):
                to = f" for the store at {r.dialling['host']}:{r.dialling['port']}"
                if r.given and (str(r.given.get("host")), int(r.given.get("port") or 0)) != \
                        (str(r.dialling["host"]), int(r.dialling["port"])):
                    to += f" (torchrun gave it {r.given['host']}:{r.given['port']})"
            what = "waiting at the rendezvous" if w.kind == "rendezvous" else f"in {w.op} on the TCPStore"
            return f"{what}{to}{at}"
        if w.kind == "thread":
            return (f"finished its main thread, kept alive by thread '{w.op}' (not a daemon: Python waits for "
                    f"it at exit){at}")
        if w.kind == "child":
            which = f"child process '{w.op}'" if w.op else "a child process"
            return (f"finished its main thread, waiting at exit for {which} (not a daemon: multiprocessing joins "
                    f"it at exit)" + (f", started{at}" if w.frame is not None else at))
        if w.kind in KIND_PHRASE:
            op = f" ({w.op})" if w.op and w.kind not in ("sleep",) else ""
            return f"{KIND_PHRASE[w.kind]}{op}, not in any collective{at}"
        return f"running outside any collective{at}"
    if r.state in ALIVE:
        return f"still running{at}"
    if r.state == RankState.NOT_STARTED:
        return "never started"
    done = f" after collective #{r.ledger[-1].seq}" if r.ledger else ""
    if r.exit_code == 0:
        return f"exited cleanly (exit 0){done}"
    if r.error is not None:
        return f"failed with {r.error.type}: {_first_line(r.error.message)}{at}"
    how = f"exit code {r.exit_code}" if r.exit_code is not None else (r.signal or "an unknown signal")
    return f"ended ({how}){done}"


def wait_sentence(result: "RunResult", paths: "Paths | None" = None) -> str:
    """Which ranks the others waited for, and whether those were busy, blocked or gone."""
    w = waits.waited_for(result)
    if w is None:
        return ""
    paths = paths or Paths()
    r = w.rep
    what = (f" in {w.op}" + (f" #{w.seq}" if w.seq is not None else "")) if w.op else ""
    if w.how == "busy":
        state = f"busy: its CPU time was still growing ({r.cpu_busy:.2f} of a core){paths.at(r)}"
    elif w.how == "gone":
        state = f"gone: it had {state_phrase(r, paths).removeprefix('exited ')}" if r.state == RankState.EXITED else \
            f"gone: {state_phrase(r, paths)}"
    else:
        state = f"blocked, {state_phrase(r, paths)}" if r.state in ALIVE else "blocked"
    last = next((c.seq for c in reversed(r.ledger) if c.completed), None)
    done = f"; its last finished collective was #{last}" if last is not None and w.how != "gone" else ""
    printed = _last_printed(r)
    said = f"; it last printed {printed!r}" if printed else ""
    return (f"{groups.label(w.waiters).capitalize()} waited{what} for {groups.label(w.waited)}, which was {state}"
            f"{_own_frames(r)}{done}{said}.")


def _own_frames(r: "RankResult") -> str:
    """The calls of the user's own code that led the rank where it stands, outermost first, when
    there is more than the one line already named."""
    from ddplab.facts import is_user_file
    own = [f for f in r.stack if is_user_file(f.file)]
    if len(own) < 2:
        return ""
    return ", called from " + " < ".join(f"{f.func} (line {f.line})" for f in own[1:4])


def group_lines(result: "RunResult", paths: "Paths | None" = None) -> list[str]:
    """One line per group of ranks in the same state, the odd group first and named as such."""
    paths = paths or Paths()
    gs = groups.group(result)
    w = waits.waited_for(result)
    said = set(w.waited) if w is not None else set()      # the wait sentence quoted their output
    out = []
    for g in gs:
        line = f"{g.label}: {state_phrase(g.rep, paths)}"
        printed = _last_printed(g.rep)
        if printed and g.rep.state in ALIVE and not said & set(g.ranks):
            line += f"; last printed {printed!r}" + (f" (rank {g.rep.rank})" if len(g.ranks) > 1 else "")
        if g.odd and result.status != "failed":
            others = groups.span(r for o in gs if o is not g for r in o.ranks)
            line += f" <- differs from the others ({others}): the likely cause"
        out.append(line)
    return out


def _last_printed(r: "RankResult", limit: int = 100) -> str:
    """The rank's last non-empty line of output, shortened."""
    line = next((l.strip() for l in reversed(r.log_tail.splitlines()) if l.strip()), "")
    return line if len(line) <= limit else line[:limit - 3] + "..."


def _first_line(text: str, limit: int = 300) -> str:
    line = next((l.strip() for l in (text or "").splitlines() if l.strip()), "")
    return line if len(line) <= limit else line[:limit - 3] + "..."


def _divergence(result: "RunResult", paths: "Paths | None" = None) -> str:
    """The first collective at which the ledgers differ, ranks grouped by what they issued there.
    Empty when the group lines already say it (every rank still waits in that collective)."""
    d = result.divergence
    if d is None:
        return ""
    paths = paths or Paths()
    by_rank = {r.rank: r for r in result.ranks}
    said = all((r := by_rank.get(k)) is not None and r.state in ALIVE and r.where is not None
               and r.where.seq == d.seq for k in d.ops)
    if said and d.kind != "different-sizes":
        return ""
    parts: dict[tuple, list[int]] = {}
    for rank in sorted(d.ops):
        op, r = d.ops[rank], by_rank.get(rank)
        if op is None:
            gone = r is not None and r.state == RankState.EXITED
            parts.setdefault(("never", d.last.get(rank), gone), []).append(rank)
            continue
        sizes = d.sizes.get(rank)
        frame = r.frame if r is not None and r.where is not None and r.where.seq == d.seq else None
        parts.setdefault(("op", op, tuple(sizes or ()), frame), []).append(rank)
    text = []
    for key, ranks in sorted(parts.items(), key=lambda kv: (len(kv[1]), kv[1][0])):
        if key[0] == "never":
            text.append(f"{groups.label(ranks)} never reached it (last was #{key[1]})"
                        + (" and had exited" if key[2] else ""))
            continue
        _, op, sizes, frame = key
        size = (f" {[list(s) for s in sizes]}" if d.kind == "different-sizes" and sizes
                else (f" of {numel(sizes)} elements" if sizes else ""))
        at = paths.at(by_rank[ranks[0]]) if frame is not None else ""
        text.append(f"{groups.label(ranks)} {op}{size}{at}")
    what = {"different-op": "the ranks diverged", "different-sizes": "the ranks passed different sizes",
            "shorter-ledger": "not every rank issued it"}[d.kind]
    return f"Collective #{d.seq}: {what}: " + "; ".join(text) + "."


def diagnosis(result: "RunResult") -> str:
    """What happened, made from the fields: a lead sentence, then one line per group of ranks in
    the same state (so its length follows the distinct states, not the number of ranks)."""
    s = result.status
    if s == "ok":
        return ""
    paths = Paths()
    if s == "failed":
        return _failed(result, paths)
    if result.signature == "no-rank-started":
        return "torchrun started no rank before it stopped making progress."
    lead = ""
    if s == "hung" and result.stall is not None:
        st = result.stall
        after = f", after collective #{st.last_seq}" if st.last_seq is not None else ""
        origin = "ddplab attached" if result.attached_pid is not None else "launch"
        lead = (f"No rank made progress for {st.idle_s:.1f} s (since {st.since_s:.1f} s after {origin}{after}); "
                f"the stall window is {st.window_s:g} s.")
        if st.waited_for_timeout_s:
            lead += f" ddplab waited {st.waited_for_timeout_s:.1f} s more for PyTorch's own timeout."
    elif s == "deadline":
        lead = f"The job was still making progress when its outer limit of {result.deadline_s:g} s ran out."
    elif s == "interrupted":
        lead = f"The run was interrupted after {result.wall_s:.1f} s."
    elif s == "running":
        lead = f"The job kept making progress while ddplab watched it for {result.wall_s:.1f} s: slow, perhaps, but not stuck."
    elif s == "exited":
        return "The job ended while ddplab watched it."
    div = _divergence(result, paths)
    head = " ".join(x for x in (lead, wait_sentence(result, paths), div, p2p_sentence(result),
                                spawn_sentence(result), asks_sentence(result), in_flight_sentence(result),
                                calls_sentence(result), args_sentence(result)) if x)
    return "\n".join([head] + group_lines(result, paths) if head else group_lines(result, paths))


def _at(f) -> str:
    return f"{short_path(f.file)}:{f.line} in {f.func}" if f is not None else "?"


def in_flight_sentence(result: "RunResult") -> str:
    """Live ranks blocked in a collective they called while an exception was in flight in that thread."""
    from ddplab.engine.callsites import pending_call
    parts = []
    for r in result.ranks:
        c = pending_call(r) if r.state in ALIVE else None
        if c is not None and c.exc is not None:
            parts.append(f"Rank {r.rank} called {c.op} at {_at(c.frame)} while handling {c.exc.type}: "
                         f"{_first_line(c.exc.message, 160)} (raised at {_at(c.exc.at)}).")
    return " ".join(parts)


def calls_sentence(result: "RunResult") -> str:
    """Where the ranks' recorded call sites part (``RunResult.calls_diverged``)."""
    d = getattr(result, "calls_diverged", None)
    if d is None:
        return ""
    def site(c) -> str:
        # the file by its name, as the rank groups below show it (the path in full was given once above)
        return f"{c.op} at {Path(c.frame.file).name}:{c.frame.line} in {c.frame.func}" if c.frame else c.op

    by_site: dict[str, list[int]] = {}
    for k, c in sorted(d.first.items()):        # ranks grouped by the place of their call: 8 or 1,024 read alike
        by_site.setdefault(site(c) if c is not None else "no call", []).append(k)
    each = "; ".join(f"{label(ks)} {where}" for where, ks in by_site.items())
    text = f"Their recorded calls part at call #{d.n}: {each}."
    if d.last_same is not None:
        text += f" The last call they made from one place: {site(d.last_same)}."
    return text


_ARG_WORDS = {"root": "roots", "group": "groups", "reduce_op": "reduce ops", "length": "list lengths",
              "shape": "shapes", "dtype": "dtypes"}


def arg_value(kind: str, v) -> str:
    """One rank's value of an argument (``ArgsDiffer.values``) in words."""
    if kind == "root":
        return f"named rank {v}"
    if kind == "group":
        return "used the default group" if v is None else f"used a group of ranks {list(v)}"
    if kind == "reduce_op":
        return f"passed ReduceOp.{v}"
    if kind == "length":
        return f"passed a list of {v}"
    if kind == "shape":
        return f"passed shape {list(v)}"
    return f"passed {v}"


def args_sentence(result: "RunResult", limit: int = 4) -> str:
    """The first call at which the ranks passed the same collective arguments that must agree and do not
    (``RunResult.args_differ``): which argument, and each rank's value (ranks grouped by value, the ``limit`` most
    common values: 1,024 ranks that each name themselves read as 8 do)."""
    d = getattr(result, "args_differ", None)
    if d is None:
        return ""
    lines = {(f.file, f.line) for _, f in d.frames if f is not None}
    f = next((f for _, f in d.frames if f is not None), None)
    at = f" at {Path(f.file).name}:{f.line}" if f is not None and len(lines) == 1 else ""
    param = f" ({d.param})" if d.param and d.param != d.arg else ""
    by = d.ranks_by_value
    each = "; ".join(f"{label(list(rs))} {arg_value(d.arg, v)}" for v, rs in by[:limit])
    if len(by) > limit:
        each += f"; and {len(by) - limit} other values on {label([r for _, rs in by[limit:] for r in rs])}"
    return (f"At call #{d.n} every rank called {d.op}{at} with different {_ARG_WORDS.get(d.arg, d.arg)}{param}: "
            f"{each}.")


def p2p_sentence(result: "RunResult", limit: int = 8) -> str:
    """Which rank waits for which peer in blocked point-to-point calls, and what that peer is doing."""
    blocked = [r for r in result.ranks if r.state in ALIVE and r.where is not None
               and r.where.kind == "p2p" and r.peer and r.peer.get("peer") is not None]
    if not blocked:
        return ""
    by = {r.rank: r for r in result.ranks}
    parts = []
    for r in blocked[:limit]:
        p = by.get(r.peer["peer"])
        if p is None:
            doing = "which is not a rank of this job"
        elif p.state in ALIVE and p.where is not None and p.where.kind == "p2p":
            doing = f"which is itself in {p.where.op}" + (f" to rank {p.peer['peer']}" if p.peer and
                                                          p.where.op in ("send", "isend", "send_object_list") else
                                                          f" from rank {p.peer['peer']}" if p.peer else "")
        else:
            doing = f"which is {state_phrase(p)}"
        verb = "sends to" if r.where.op in ("send", "isend", "send_object_list") else "waits to receive from"
        tag = f" with tag {r.peer['tag']}" if r.peer.get("tag") is not None else ""
        parts.append(f"rank {r.rank} {verb} rank {p.rank if p else r.peer['peer']}{tag}, {doing}")
    more = f" (and {len(blocked) - limit} more)" if len(blocked) > limit else ""
    text = "Point-to-point: " + "; ".join(parts) + more + "."
    if result.signature == "hang-p2p-ordering":
        ops = {r.where.op for r in blocked}
        first = "sends first" if ops <= {"send", "send_object_list"} else "receives first"
        text += f" Every rank {first}: no send meets a receive."
    if result.signature == "p2p-tag-mismatch":
        text += " A send meets only a receive of the same tag."
    return text


def asks_sentence(result: "RunResult") -> str:
    """What the processes waiting at the rendezvous asked init_process_group for: ranks asked twice,
    ranks nobody asked for, world sizes."""
    from ddplab.engine.reasons import init_asks, rendezvous_asks
    a = rendezvous_asks(result.ranks)
    if a is None and result.signature == "rendezvous-ranks-conflict":
        a = init_asks(result.ranks)        # a rendezvous that timed out: what each process had asked for
    if a is None:
        return ""
    by: dict = {}
    for p, (rank, _) in sorted(a.by_process.items()):
        by.setdefault(rank, []).append(p)
    parts = [f"rank {k if k is not None else '?'} by {'process' if len(v) == 1 else 'processes'} "
             f"{groups.span(v)}" for k, v in sorted(by.items(), key=lambda kv: (kv[0] is None, kv[0] or 0))]
    text = "At init_process_group the processes (numbered as torchrun started them) asked for " + "; ".join(parts)
    sizes = sorted(a.world_sizes)
    text += f", in a world of {' / '.join(map(str, sizes))}" if sizes else ""
    if a.duplicates:
        text += "; " + ", ".join(f"rank {k} was asked for {len(v)} times" for k, v in sorted(a.duplicates.items()))
    if a.missing:
        text += f"; no {'waiting ' if result.status == Status.HUNG else ''}process asked for {groups.label(list(a.missing))}"
    if len(sizes) == 1 and sizes[0] != a.job:
        text += f"; the job started {a.job} processes"
    return text + "."


def spawn_sentence(result: "RunResult") -> str:
    """Ranks waiting for the processes they started themselves with mp.spawn."""
    if result.signature != "spawn-under-torchrun":
        return ""
    from ddplab.engine.reasons import spawns
    ranks = [r.rank for r in result.ranks if r.state in ALIVE and spawns(r)]
    return (f"{groups.label(ranks).capitalize()} (started by torchrun) wait in torch.multiprocessing's spawn for "
            f"processes of their own: {result.nproc} x nprocs processes in all." if ranks else "")


def _failed(result: "RunResult", paths: "Paths") -> str:
    first = result.first_failure
    if first is None:
        return "torchrun failed before any rank started." if not any(r.pid for r in result.ranks) else \
            "A rank failed, but no rank left a record of why."
    r = result.rank(first)
    if r.error is not None:
        what = f"{r.error.type}: {_first_line(r.error.message)}"
    elif getattr(r, "ended", None) is not None:
        e = r.ended
        user = next((f for f in e.frames if is_user_file(f.file)), e.frames[0] if e.frames else None)
        what = f"it called {e.how}({e.code}) at {_at(user)}: no traceback, no exit handler"
    elif r.signal:
        what = f"killed by {r.signal}" + (" with no Python error (the kernel's OOM killer, or a kill)"
                                           if r.signal == "SIGKILL" else "")
    else:
        tail = _first_line("\n".join(reversed([l for l in r.log_tail.splitlines() if l.strip()][-1:])))
        what = f"exit code {r.exit_code}" + (f": {tail}" if tail else "")
    out = [f"Rank {first} failed first: {what}{paths.at(r)}."]
    from ddplab.engine.callsites import failed_in_flight
    c = failed_in_flight(r.stack, r.calls)
    if c is not None:
        out.append(f"It failed in {c.op} at {_at(c.frame)}, called while handling {c.exc.type}: "
                   f"{_first_line(c.exc.message, 160)} (raised at {_at(c.exc.at)}).")
    out.append(wait_sentence(result, paths))
    out.append(asks_sentence(result))
    out.append(args_sentence(result))
    d = result.divergence
    if result.signature == "rank-exited-early" and d is not None:
        gone = [k for k, op in sorted(d.ops.items()) if op is None]
        waiting: dict[str, list[int]] = {}
        for k, op in sorted(d.ops.items()):
            if op is not None:
                waiting.setdefault(op, []).append(k)
        out.append(f"That is a consequence: {groups.label(gone)} had exited cleanly after "
                   f"collective #{min(d.last[k] for k in gone)} while "
                   f"{', '.join(f'{groups.label(ks)} in {op} #{d.seq}' for op, ks in waiting.items())} still waited for it.")
    if r.error is not None and r.error.env:
        given = r.given or {}
        used = (r.error.env.get("MASTER_ADDR"), r.error.env.get("MASTER_PORT"))
        if given and used[1] and (str(used[0]), str(used[1])) != (str(given.get("host")), str(given.get("port"))):
            out.append(f"It connected to {used[0]}:{used[1]}; torchrun gave it {given.get('host')}:{given.get('port')}.")
    for g in groups.group(result):
        if first in g.ranks or g.rep.error is None:
            continue
        o = g.rep
        out.append(f"{groups.label(g.ranks).capitalize()} then failed with {o.error.type}: "
                   f"{_first_line(o.error.message, 160)}"
                   f"{' (a consequence: lost the connection to rank ' + str(first) + ')' if o.consequence else ''}.")
    if any(o.state == RankState.EXITED and o.signal == "SIGTERM" for o in result.ranks):
        out.append("torchrun then ended the other ranks.")
        out.append(_ended_where(result, first, paths))
    lines = [" ".join(x for x in out if x)]
    if r.error is not None:
        lines += error_details(r.error)
    return "\n".join(lines)


def _ended_where(result: "RunResult", first: int, paths: "Paths") -> str:
    """Where the ranks torchrun ended were when it did (the rank hook's SIGTERM dump), a group per state."""
    from dataclasses import replace
    ended = [r for r in result.ranks if r.rank != first and r.state == RankState.EXITED and r.signal == "SIGTERM"
             and r.where is not None]
    by: dict[str, list[int]] = {}
    for r in ended:
        by.setdefault(state_phrase(replace(r, state="running"), paths), []).append(r.rank)
    return ("When it did, " + "; ".join(f"{groups.label(ks)} {'was' if len(ks) == 1 else 'were'} {p}"
                                        for p, ks in by.items()) + ".") if by else ""


MESSAGE_LINES = 40     # lines of one exception's message shown (the record keeps them all)


def _message_rest(message: str, indent: str = "  ") -> list[str]:
    """The lines of a message after its first, as the exception gave them (never cut to one line)."""
    rest = [l.rstrip().replace("\t", "  ") for l in (message or "").splitlines()[1:]]
    while rest and not rest[-1].strip():
        rest.pop()
    if len(rest) > MESSAGE_LINES:
        rest = rest[:MESSAGE_LINES] + [f"... ({len(rest) - MESSAGE_LINES} more lines in the rank's error record)"]
    return [indent + l for l in rest]


def _call_sentence(frames, values: dict | None, lead: str) -> str:
    """Where the library raised it and the user's call that led there, with the values on that line."""
    from ddplab.engine.reasons import user_call
    c = user_call(tuple(frames), values)
    if c is None:
        inner = frames[0] if frames else None
        return f"{lead} raised at {inner.short()} (no frame of your own code)." if inner is not None else ""
    code = f": `{_code(c.frame.text)}`" if c.frame.text else ""
    vals = ", ".join(f"{k} = {v}" for k, v in c.values.items())
    vals = f", with {vals}" if vals else ""
    if c.callee is None:
        return f"{lead} raised on your own line{code}{vals}." if code or vals else ""
    inside = f" (inside {c.raised.short()})" if c.raised is not None and c.raised != c.callee else ""
    return (f"{lead} raised in {c.callee.func} ({short_path(c.callee.file)}){inside}, "
            f"called from your code at {c.frame.short()}{code}{vals}.")


def _code(text: str) -> str:
    """A source line as shown: without its trailing comment (a `#` after two spaces)."""
    return text.split("  #", 1)[0].strip()


def error_details(e) -> list[str]:
    """The whole exception of a rank beyond its first line: the rest of its message, the user's call
    that led into the library, the exceptions chained to it, and a framework's exit after it."""
    out = _message_rest(e.message)
    where = _call_sentence(e.frames, e.values, "It was")
    if where:
        out.append(where)
    for c in e.chain:
        how = "It was raised from" if c.relation == "cause" else "It was raised while handling"
        out.append(f"{how} {c.type}: {_first_line(c.message)}")
        out += _message_rest(c.message, "    ")
        own = _call_sentence(c.frames, None, "  that one was")
        if own:
            out.append(own)
    n = getattr(e, "nested", None)
    if n is not None:
        own = next((f for f in n.frames if is_user_file(f.file)), n.frames[0] if n.frames else None)
        out.append(f"It was re-raised from another process: {n.type} {n.where} (a process this rank started), "
                   f"raised there at {_at(own)}: {_first_line(n.message, 160)}.")
    if e.exited:
        at = e.exited.get("frames") or []
        by = f" in {short_path(at[0]['file'])}" if at else ""
        out.append(f"Then sys.exit({e.exited.get('code')}) was called{by} while handling it.")
    return out


def progressing_at_stop(result: "RunResult") -> bool:
    """An interrupted job whose ranks were still making progress when it was stopped (its ``stopped``
    facts: idle for less than the stall window): a hang signature is not shown for it (issue 42)."""
    st = getattr(result, "stopped", None)
    return result.status == "interrupted" and st is not None and st.idle_s < st.window_s and \
        bool(result.signature) and result.signature.startswith("hang-")


def headline(result: "RunResult") -> str:
    v = f" --variant {result.variant}" if result.variant else ""
    sig = f" [{result.signature}]" if result.signature and not progressing_at_stop(result) else ""
    # torch's own dumps read by `ddplab explain` say nothing of how long the job ran (wall_s 0). The
    # seconds count from the command's start, as the user's clock does; start-up is named where it
    # is a noticeable part (STARTUP_SHOWN_S), so that "in 53.8 s" is the whole command
    startup = getattr(result, "startup_s", 0.0) or 0.0
    took = f" in {result.wall_s + startup:.1f} s" if result.wall_s > 0 else ""
    parts = [f"{result.nproc} ranks"]
    if result.wall_s > 0 and startup >= STARTUP_SHOWN_S:
        parts.append(f"{startup:.1f} s of it start-up before torchrun")
    return f"{result.target}{v}: {result.status}{sig}{took} ({'; '.join(parts)})"


STARTUP_SHOWN_S = 1.0


def _waits(r: "RankResult") -> str:
    """What a rank waits in, with the collective's number when the ledger knows it, and the library
    frame the user's call led into ("inside Lightning's strategy.barrier()")."""
    if not r.waits_in:
        return ""
    return (r.waits_in + (f" #{r.where.seq}" if r.where is not None and r.where.seq is not None else "")
            + library_phrase(r.where))


def library_phrase(w: "Where | None") -> str:
    """" inside Lightning's strategy.barrier() (lightning/pytorch/strategies/ddp.py:303),": the library
    frame the user's call leads into, in the library's terms (``ddplab.engine.libraries``' data)."""
    lib = w.library if w is not None else None
    if lib is None:
        return ""
    what = libraries.describe(lib.library, lib.role) or \
        f"{libraries.name_of(lib.library)}'s {lib.frame.func.rsplit('.', 1)[-1]}"
    return f" inside {what} ({short_path(lib.frame.file)}:{lib.frame.line}),"


def _state(r: "RankResult") -> str:
    if r.state in ALIVE:
        return ("no progress" if r.state == RankState.HUNG else "still running") + (", ended by ddplab" if r.signal else "")
    if r.state == RankState.NOT_STARTED:
        return "never started"
    return f"exit {r.exit_code}" if r.exit_code is not None else (r.signal or "?")


def identified(result: "RunResult") -> bool:
    """False where the run failed or hung and no catalog entry whose premise the evidence holds
    explains it: the view then says "cause not identified" and shows the evidence, no fix, no lab."""
    from ddplab.engine import signatures
    if result.status not in ("failed", "hung"):
        return True
    return result.signature is not None and result.signature not in signatures.UNIDENTIFIED


def culprit_sentence(result: "RunResult") -> str:
    """The ranks the evidence blames (where they are not simply the first failing rank) and the line of
    their script that set the failure up (``fix_at``), from the fields."""
    blamed = tuple(getattr(result, "culprits", ()) or ())
    fa = getattr(result, "fix_at", None)
    parts = []
    if blamed and (result.status != "failed" or blamed != (result.first_failure,)):
        who = groups.span(blamed) if len(blamed) > 1 else str(blamed[0])
        parts.append(f"The evidence points at rank{'s' if len(blamed) > 1 else ''} {who}.")
    if fa is not None:
        # its base name: the diagnosis above names the script's path in full already (where any rank stood)
        shown = any(r.frame is not None and r.frame.file == fa.file for r in result.ranks)
        at = f"{Path(fa.file).name}:{fa.line}" if shown else fa.short().rsplit(" in ", 1)[0]
        code = _code(fa.text or "")
        parts.append(f"The line that set it up: {at}" + (f" `{code}`." if code else "."))
    return " ".join(parts)


def peer_ends(result: "RunResult") -> str | None:
    """How the ranks other than the one that lost its peer ended, from their exit facts: "died" only for
    a rank ended by a signal or a non-zero exit, "exited cleanly" for one that exited 0."""
    parts = []
    for r in result.ranks:
        if r.rank == result.first_failure or r.state != RankState.EXITED:
            continue
        if r.exit_code == 0 and r.error is None:
            parts.append(f"rank {r.rank} exited cleanly (exit code 0): it finished, it did not die")
        elif r.signal and r.signal != "SIGTERM":
            parts.append(f"rank {r.rank} died ({r.signal})")
        elif r.exit_code not in (None, 0):
            parts.append(f"rank {r.rank} died (exit code {r.exit_code}"
                         f"{', ' + r.error.type if r.error is not None else ''})")
    text = "; ".join(parts)
    return text[0].upper() + text[1:] + "." if parts else None


def different_collectives(result: "RunResult") -> str | None:
    """Where the ranks' ledgers are not one the prefix of the other (not fewer of the same steps, but a
    collective only some ranks call), the advice for that: uneven data's remedies (the same number of
    batches, Join) do not apply, and Join would add its own collectives to a job already out of step."""
    seqs = {r.rank: [c.op for c in sorted(r.ledger, key=lambda c: c.seq)] for r in result.ranks if r.ledger}
    if len(seqs) < 2:
        return None
    ordered = sorted(seqs.values(), key=len)
    if all(longer[:len(ordered[0])] == ordered[0] for longer in ordered[1:]):
        return None          # fewer of the same collectives: uneven data, the catalog's advice holds
    counts = {rank: {} for rank in seqs}
    for rank, ops in seqs.items():
        for op in ops:
            counts[rank][op] = counts[rank].get(op, 0) + 1
    kinds = sorted({op for c in counts.values() for op in c})
    differs = [op for op in kinds if len({c.get(op, 0) for c in counts.values()}) > 1]
    shown = "; ".join(f"{op}: " + ", ".join(f"rank {r} {counts[r].get(op, 0)}" for r in sorted(counts))
                      for op in differs)
    return (f"The ranks did not run fewer of the same steps: they called different collectives ({shown}). Find "
            f"the call only some ranks make (an `if rank == 0:` around a collective or a forward through the DDP "
            f"wrapper) and make it on every rank or on none; more batches or Join do not apply here.")


# the causes whose premise is read from what the ranks printed: their explanation points at that evidence
SHOWS_PRINTED = {"path-differs-across-ranks"}


def printed_evidence(result: "RunResult") -> str:
    """Where no cause is identified (or the cause's premise is read from it), the most specific thing the ranks
    printed differently (``result.printed``: a labelled quantity the ranks share with different values), and how
    many more there are."""
    diffs = tuple(getattr(result, "printed", ()) or ())
    if not diffs or progressing_at_stop(result) or (identified(result) and result.signature not in SHOWS_PRINTED):
        return ""
    more = len(diffs) - 1
    return printed_sentence(diffs[0]) + (f" ({more} more quantit{'ies' if more > 1 else 'y'} differ in the ranks' "
                                         f"output: RunResult.printed.)" if more else "")


def explain(result: "RunResult") -> str:
    from ddplab.engine import signatures

    lines = [headline(result)]
    if progressing_at_stop(result):
        st = result.stopped
        lines.append(f"  Interrupted while the ranks were still making progress (the last progress {st.idle_s:g} s "
                     f"before the interrupt, within the {st.window_s:g} s stall window): where each rank was "
                     f"follows; nothing shows a hang.")
    elif not identified(result):
        lines.append("  Cause not identified: no known failure fits the evidence; what the ranks did follows.")
    elif result.signature:
        sig = signatures.get(result.signature)
        lines.append(f"  {sig.title}.")
        what, *advice = sig.explanation.splitlines()
        lines.append(f"  {what}")
        ended = peer_ends(result) if result.signature in ("peer-lost", "rank-exited-early") else None
        if ended:
            lines.append(f"  {ended}")
        other = different_collectives(result) if result.signature == "rank-exited-early" else None
        lines += [f"  {t}" for t in ([other] if other else advice)]
        if sig.lab:      # the lab whose own variant shows this failure (the catalog's: tests/test_signatures.py)
            lines.append(f"  Lab {sig.lab} teaches this failure.")
    d = diagnosis(result)
    if d:
        first, *rest = d.splitlines()
        lines.append(f"  Diagnosis: {first}")
        lines += [f"    {t}" for t in rest]
    c = culprit_sentence(result)
    if c:
        lines.append(f"  {c}")
    p = printed_evidence(result)
    if p:
        lines.append(f"  {p}")
    if result.excerpt and result.status == "failed":
        lines.append(f"  Evidence: {result.excerpt}")
    if result.status in ("ok", "failed"):   # a hang's diagnosis already shows each group's state
        lines += [f"  {g.label}: {_state(g.rep)}" for g in groups.group(result)]
    lines += [f"  note: {n}" for n in result.notes]
    lines += check_lines(result.check)        # ddplab run --check: "ok, but ..."
    lines.append(f"  run dir: {_rel(result.run_dir)}")
    return "\n".join(lines)


def _rel(path: str) -> str:
    """A path relative to the working folder when it is inside it."""
    try:
        return str(Path(path).resolve().relative_to(Path.cwd()))
    except (ValueError, OSError):
        return path


COLOURS = {"ok": "#1a7f37", "failed": "#cf222e", "hung": "#9a6700", "deadline": "#9a6700", "interrupted": "#6e7781",
           "running": "#0969da", "exited": "#6e7781"}


BOLD = " style='font-weight:bold'"   # the odd group's row


def html(result: "RunResult") -> str:
    from ddplab.engine import signatures

    e = _html.escape
    paths = Paths()
    rows = "".join(
        f"<tr{BOLD if g.odd else ''}><td>{e(groups.span(g.ranks))}</td><td>{e(_state(g.rep))}</td>"
        f"<td>{e(str(g.rep.exit_code) if g.rep.exit_code is not None else (g.rep.signal or ''))}</td>"
        f"<td>{e(_waits(g.rep))}</td>"
        f"<td>{e(g.rep.error.type + ': ' + _first_line(g.rep.error.message, 120) if g.rep.error else '')}</td>"
        f"<td><code>{e(paths.at(g.rep).removeprefix(' at '))}</code></td></tr>"
        for g in groups.group(result))
    sig = ""
    if not identified(result):
        sig = "<p><b>Cause not identified</b>: no known failure fits the evidence; what the ranks did follows.</p>"
    elif result.signature:
        s = signatures.get(result.signature)
        lab = f", lab {e(s.lab)}" if s.lab else ""
        sig = (f"<p><b>{e(s.title)}</b> (<code>{e(s.id)}</code>{lab})<br>"
               f"{'<br>'.join(e(t) for t in s.explanation.splitlines())}</p>")
    d = diagnosis(result)
    diag = f"<p><b>Diagnosis:</b> {'<br>'.join(e(t) for t in d.splitlines())}</p>" if d else ""
    ev = (f"<p><b>Evidence:</b> <code>{e(result.excerpt)}</code></p>"
          if result.excerpt and result.status == "failed" else "")
    p = printed_evidence(result)
    ev = (f"<p>{e(p)}</p>" if p else "") + ev
    return (f"<div><p><b style='color:{COLOURS.get(result.status, '#000')}'>{e(result.status.upper())}</b> "
            f"<code>{e(result.target)}</code> {e(result.variant or '')}: {result.wall_s:.1f} s, {result.nproc} ranks</p>"
            f"{sig}{diag}{ev}<table><tr><th>ranks</th><th>state</th><th>exit</th><th>waits in</th><th>error</th>"
            f"<th>its code</th></tr>{rows}</table>{check_html(result.check)}<p><small>{e(_rel(result.run_dir))}</small></p></div>")


def _row_phrase(row: dict) -> str:
    st = row["state"]
    if st == "waiting":
        return f"in {row['op']} #{row['seq']}"
    if st == "exited":
        code = row.get("exit_code")
        return "exited" + (f" {code}" if code is not None else "")
    if st == "running" and row.get("seq") is not None:
        return f"running (done #{row['seq']})"
    return st


def status_line(snap: "Snapshot") -> str:
    """The live line: elapsed time, the ranks grouped by state, and how long nothing has moved."""
    by: dict[str, list[int]] = {}
    for row in snap.ranks:
        by.setdefault(_row_phrase(row), []).append(row["rank"])
    parts = [f"{groups.label(ranks)}: {phrase}" for phrase, ranks in sorted(by.items(), key=lambda kv: min(kv[1]))]
    idle = f" | no progress for {snap.idle_s:.0f} s (hung at {snap.stall_s:g} s)" if snap.idle_s >= 1.0 else ""
    return f"{snap.elapsed_s:5.1f} s | " + " | ".join(parts) + idle


def divergence_line(result) -> str | None:
    """A view: "Collective #4 diverged first at node n1 (node rank 1), rank 1: barrier (the others: all_reduce)"."""
    f = groups.first_divergence(result)
    if f is None or not f["ranks"]:
        return None
    who = "; ".join(f"node {x['node']}, rank {x['rank']}" if x["node"] else f"rank {x['rank']}" for x in f["ranks"])
    what = f["op"] or "never issued it"
    others = "; ".join(f"{o['op'] or 'none'} on rank{'s' if len(o['ranks']) > 1 else ''} {', '.join(map(str, o['ranks']))}"
                       for o in f["others"])
    return f"Collective #{f['seq']} diverged first at {who}: {what} (the others: {others})."
