"""Rendering: sentences made from a result's fields, only when shown (text, HTML, the live status line).

Nothing here is parsed back: tests and notebooks read the fields of ``RunResult`` and
``RankResult``; these functions are the views for people.
"""
from __future__ import annotations

import html as _html
from typing import TYPE_CHECKING

from .ledger import numel
from .render_check import check_html, check_lines

if TYPE_CHECKING:  # pragma: no cover
    from .result import RankResult, RunResult
    from .stacks import Where
    from .supervise import Snapshot

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


def wait_phrase(w: "Where | None") -> str | None:
    """What a rank is blocked in, in a few words: "barrier", "all_reduce (DDP gradients, inside backward)"."""
    if w is None:
        return None
    if w.kind == "collective":
        return f"{w.op} ({VIA[w.via]})" if w.via in VIA and w.via != "init_process_group" else w.op
    if w.kind == "rendezvous":
        return f"{w.op} (rendezvous)"
    if w.kind == "store":
        return f"{w.op} (the TCPStore)"
    if w.kind in ("sleep", "socket", "dataloader", "lock"):
        return f"{w.op}" if w.op else w.kind
    return None


def _at(r: "RankResult") -> str:
    return f" at {r.frame.short()}" if r.frame else ""


def rank_phrase(r: "RankResult", result: "RunResult | None" = None) -> str:
    """One rank's state at the end of the run, as a clause starting with "rank N"."""
    w = r.where
    if r.state in ("hung", "running") and w is not None:
        if w.kind == "collective":
            seq = f" #{w.seq}" if w.seq is not None else ""
            pend = next((c for c in reversed(r.ledger) if c.seq == w.seq and not c.completed), None) if w.seq else None
            size = f" of {pend.numel} elements" if pend is not None and pend.sizes else ""
            via = f" ({VIA[w.via]})" if w.via in VIA and w.via != "init_process_group" else ""
            return f"rank {r.rank} waits in {w.op}{seq}{size}{via}{_at(r)}"
        if w.kind == "rendezvous" or w.kind == "store":
            to = ""
            if r.dialling and r.dialling.get("host"):
                to = f" for the store at {r.dialling['host']}:{r.dialling['port']}"
                if r.given and (str(r.given.get("host")), int(r.given.get("port") or 0)) != \
                        (str(r.dialling["host"]), int(r.dialling["port"])):
                    to += f" (torchrun gave it {r.given['host']}:{r.given['port']})"
            what = "waits at the rendezvous" if w.kind == "rendezvous" else f"waits in {w.op} on the TCPStore"
            return f"rank {r.rank} {what}{to}{_at(r)}"
        if w.kind in KIND_PHRASE:
            op = f" ({w.op})" if w.op and w.kind not in ("sleep",) else ""
            return f"rank {r.rank} is {KIND_PHRASE[w.kind]}{op}, not in any collective{_at(r)}"
        return f"rank {r.rank} is running outside any collective{_at(r)}"
    if r.state in ("hung", "running"):
        return f"rank {r.rank} was still running{_at(r)}"
    if r.state == "not-started":
        return f"rank {r.rank} never started"
    done = f" after collective #{r.ledger[-1].seq}" if r.ledger else ""
    if r.exit_code == 0:
        return f"rank {r.rank} had exited cleanly (exit 0){done}"
    if r.error is not None:
        return f"rank {r.rank} failed with {r.error.type}: {_first_line(r.error.message)}{_at(r)}"
    how = f"exit code {r.exit_code}" if r.exit_code is not None else (r.signal or "an unknown signal")
    return f"rank {r.rank} ended ({how}){done}"


def _first_line(text: str, limit: int = 300) -> str:
    line = next((l.strip() for l in (text or "").splitlines() if l.strip()), "")
    return line if len(line) <= limit else line[:limit - 3] + "..."


def _divergence(result: "RunResult") -> str:
    d = result.divergence
    if d is None:
        return ""
    parts = []
    for rank in sorted(d.ops):
        op = d.ops[rank]
        r = result.rank(rank) if any(x.rank == rank for x in result.ranks) else None
        if op is None:
            last = d.last.get(rank)
            gone = " and had exited" if r is not None and r.state == "exited" else ""
            parts.append(f"rank {rank} never reached it (its last was #{last}){gone}")
            continue
        size = f" of {numel(d.sizes.get(rank))} elements" if d.sizes.get(rank) else ""
        shape = f" {[list(s) for s in d.sizes[rank]]}" if d.kind == "different-sizes" and d.sizes.get(rank) else ""
        at = ""
        if r is not None and r.where is not None and r.where.seq == d.seq and r.frame is not None:
            at = f" at {r.frame.short()}"
        parts.append(f"rank {rank} {op}{shape if shape else size}{at}")
    what = {"different-op": "the ranks diverged", "different-sizes": "the ranks passed different sizes",
            "shorter-ledger": "not every rank issued it"}[d.kind]
    return f"Collective #{d.seq}: {what}: " + "; ".join(parts) + "."


def diagnosis(result: "RunResult") -> str:
    """One paragraph: what happened, per rank where it matters, made from the fields."""
    s = result.status
    if s == "ok":
        return ""
    if s == "failed":
        return _failed(result)
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
    div = _divergence(result)
    ranks = "; ".join(rank_phrase(r, result) for r in result.ranks) + "."
    return " ".join(x for x in (lead, div, ranks[0].upper() + ranks[1:]) if x)


def _failed(result: "RunResult") -> str:
    first = result.first_failure
    if first is None:
        return "torchrun failed before any rank started." if not any(r.pid for r in result.ranks) else \
            "A rank failed, but no rank left a record of why."
    r = result.rank(first)
    if r.error is not None:
        what = f"{r.error.type}: {_first_line(r.error.message)}"
    elif r.signal:
        what = f"killed by {r.signal}" + (" with no Python error (the kernel's OOM killer, or a kill)"
                                           if r.signal == "SIGKILL" else "")
    else:
        tail = _first_line("\n".join(reversed([l for l in r.log_tail.splitlines() if l.strip()][-1:])))
        what = f"exit code {r.exit_code}" + (f": {tail}" if tail else "")
    out = [f"Rank {first} failed first: {what}{_at(r)}."]
    d = result.divergence
    if result.signature == "rank-exited-early" and d is not None:
        gone = [k for k, op in sorted(d.ops.items()) if op is None]
        waiting = [f"rank {k} in {op} #{d.seq}" for k, op in sorted(d.ops.items()) if op is not None]
        out.append(f"That is a consequence: {', '.join(f'rank {k}' for k in gone)} had exited cleanly after "
                   f"collective #{min(d.last[k] for k in gone)} while {', '.join(waiting)} still waited for it.")
    if r.error is not None and r.error.env:
        given = r.given or {}
        used = (r.error.env.get("MASTER_ADDR"), r.error.env.get("MASTER_PORT"))
        if given and used[1] and (str(used[0]), str(used[1])) != (str(given.get("host")), str(given.get("port"))):
            out.append(f"It connected to {used[0]}:{used[1]}; torchrun gave it {given.get('host')}:{given.get('port')}.")
    for o in result.ranks:
        if o.rank == first or o.error is None:
            continue
        out.append(f"Rank {o.rank} then failed with {o.error.type}: {_first_line(o.error.message, 160)}"
                   f"{' (a consequence: it lost its connection to rank ' + str(first) + ')' if o.consequence else ''}.")
    if any(o.state == "exited" and o.signal == "SIGTERM" for o in result.ranks):
        out.append("torchrun then ended the other ranks.")
    return " ".join(out)


def headline(result: "RunResult") -> str:
    v = f" --variant {result.variant}" if result.variant else ""
    sig = f" [{result.signature}]" if result.signature else ""
    return f"{result.target}{v}: {result.status}{sig} in {result.wall_s:.1f} s ({result.nproc} ranks)"


def _waits(r: "RankResult") -> str:
    """What a rank waits in, with the collective's number when the ledger knows it."""
    if not r.waits_in:
        return ""
    return r.waits_in + (f" #{r.where.seq}" if r.where is not None and r.where.seq is not None else "")


def _rank_line(r: "RankResult") -> str:
    if r.state in ("hung", "running"):
        how = "no progress" if r.state == "hung" else "still running"
        how += ", ended by ddplab" if r.signal else ""
    elif r.state == "not-started":
        how = "never started"
    else:
        how = f"exit {r.exit_code}" if r.exit_code is not None else (r.signal or "?")
    waits = f", waiting in {_waits(r)}" if r.waits_in else ""
    err = f", {r.error.type}: {_first_line(r.error.message, 120)}" if r.error is not None else ""
    at = f" at {r.user_frame}" if r.user_frame else ""
    return f"  rank {r.rank}: {how}{waits}{err}{at}"


def explain(result: "RunResult") -> str:
    from . import signatures

    lines = [headline(result)]
    if result.signature:
        sig = signatures.get(result.signature)
        lines.append(f"  {sig.title}.")
        lines += [f"  {t}" for t in sig.explanation.splitlines()]
        if sig.lab:
            lines.append(f"  Lab {sig.lab} teaches this failure.")
    d = diagnosis(result)
    if d:
        lines.append(f"  Diagnosis: {d}")
    if result.excerpt and result.status == "failed":
        lines.append(f"  Evidence: {result.excerpt}")
    lines += [_rank_line(r) for r in result.ranks]
    lines += [f"  note: {n}" for n in result.notes]
    lines += check_lines(result.check)        # ddplab run --check: "ok, but ..."
    lines.append(f"  run dir: {result.run_dir}")
    return "\n".join(lines)


COLOURS = {"ok": "#1a7f37", "failed": "#cf222e", "hung": "#9a6700", "deadline": "#9a6700", "interrupted": "#6e7781",
           "running": "#0969da", "exited": "#6e7781"}


def html(result: "RunResult") -> str:
    from . import signatures

    e = _html.escape
    rows = "".join(
        f"<tr><td>{r.rank}</td><td>{e(r.state)}</td>"
        f"<td>{e(str(r.exit_code) if r.exit_code is not None else (r.signal or ''))}</td>"
        f"<td>{e(_waits(r))}</td>"
        f"<td>{e(r.error.type + ': ' + _first_line(r.error.message, 120) if r.error else '')}</td>"
        f"<td><code>{e(r.user_frame or '')}</code></td></tr>"
        for r in result.ranks)
    sig = ""
    if result.signature:
        s = signatures.get(result.signature)
        sig = (f"<p><b>{e(s.title)}</b> (<code>{e(s.id)}</code>, lab {e(s.lab)})<br>"
               f"{'<br>'.join(e(t) for t in s.explanation.splitlines())}</p>")
    d = diagnosis(result)
    diag = f"<p><b>Diagnosis:</b> {e(d)}</p>" if d else ""
    ev = (f"<p><b>Evidence:</b> <code>{e(result.excerpt)}</code></p>"
          if result.excerpt and result.status == "failed" else "")
    return (f"<div><p><b style='color:{COLOURS.get(result.status, '#000')}'>{e(result.status.upper())}</b> "
            f"<code>{e(result.target)}</code> {e(result.variant or '')}: {result.wall_s:.1f} s, {result.nproc} ranks</p>"
            f"{sig}{diag}{ev}<table><tr><th>rank</th><th>state</th><th>exit</th><th>waits in</th><th>error</th>"
            f"<th>its code</th></tr>{rows}</table>{check_html(result.check)}<p><small>{e(result.run_dir)}</small></p></div>")


def status_line(snap: "Snapshot") -> str:
    """The live line: elapsed time, each rank's state, and how long nothing has moved."""
    parts = []
    for row in snap.ranks:
        st = row["state"]
        if st == "waiting":
            parts.append(f"rank {row['rank']}: in {row['op']} #{row['seq']}")
        elif st == "exited":
            code = row.get("exit_code")
            parts.append(f"rank {row['rank']}: exited" + (f" {code}" if code is not None else ""))
        elif st == "running" and row.get("seq") is not None:
            parts.append(f"rank {row['rank']}: running (done #{row['seq']})")
        else:
            parts.append(f"rank {row['rank']}: {st}")
    idle = f" | no progress for {snap.idle_s:.0f} s (hung at {snap.stall_s:g} s)" if snap.idle_s >= 1.0 else ""
    return f"{snap.elapsed_s:5.1f} s | " + " | ".join(parts) + idle
