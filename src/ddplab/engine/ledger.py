"""The collective ledger: torch's flight recorder entries as data, and where the ranks diverged.

Every rank's flight recorder (on when TORCH_FR_BUFFER_SIZE is set; ddplab's launcher sets it) lists
the collectives that rank issued, numbered by ``collective_seq_id``. ``parse`` turns one dump into
``Collective`` records; ``divergence`` compares the ranks' ledgers: the first number at which their
operations or sizes differ, or the rank whose ledger is shorter than the others'.

The comparison is the part of torch's ``flight_recorder.components.types.Op.match`` that gloo
needs (operation type, input sizes, dtypes), written here so that the launcher does not import
torch (1.6 s) at the moment it gives a verdict; ``tests/test_ledger.py`` checks that both agree on
ledgers captured from real runs.
"""
from __future__ import annotations

# Collective, Divergence and numel live in ddplab.facts (below the engine, with the result types)
from ddplab.facts import Collective, Divergence, numel  # noqa: F401  (re-exported)


def parse(dump: dict | None) -> tuple[Collective, ...]:
    """A flight-recorder dump (``_dump_fr_trace_json`` / the ``fr_trace_json`` handler) as records,
    in issue order. Entries torch marks as p2p are kept with their op name ("send", "recv")."""
    out = []
    for e in (dump or {}).get("entries", []):
        backend, _, name = str(e.get("profiling_name", "")).partition(":")
        op = name.split(" ")[0] if name else backend
        pg = e.get("process_group") or ["?", ""]
        out.append(Collective(
            seq=int(e.get("collective_seq_id", 0)), op=op, backend=backend,
            sizes=tuple(tuple(int(x) for x in s) for s in e.get("input_sizes", [])),
            dtypes=tuple(e.get("input_dtypes", [])), completed=bool(e.get("retired", False)),
            pg=str(pg[0]), created_ns=int(e.get("time_created_ns", 0)),
            timeout_ms=int(e["timeout_ms"]) if e.get("timeout_ms") else None))
    return tuple(out)


def pending(ledger: tuple[Collective, ...]) -> Collective | None:
    """The collective this rank issued and has not finished (the last one not retired), if any."""
    open_ = [c for c in ledger if not c.completed]
    return open_[-1] if open_ else None


def last_completed(ledger: tuple[Collective, ...]) -> int | None:
    done = [c.seq for c in ledger if c.completed]
    return max(done) if done else None


def issued(ledger: tuple[Collective, ...]) -> int:
    """How many collectives this rank has issued in its busiest process group: the highest
    ``collective_seq_id`` (the flight recorder keeps only its last entries; the number keeps counting)."""
    return max((c.seq for c in ledger), default=0)


def position(ledger: tuple[Collective, ...]) -> tuple[int, int]:
    """(collectives issued, collectives completed): moves whenever the rank gets anywhere."""
    return len(ledger), sum(c.completed for c in ledger)


def match(a: Collective, b: Collective) -> str | None:
    """None when two ranks' entries for the same number agree; else "different-op" or
    "different-sizes" (torch's COLLECTIVE_TYPE_MISMATCH, SIZE_OR_SYNTAX_MISMATCH and
    COLLECTIVE_DTYPE_MISMATCH for the collectives gloo records)."""
    if a.op != b.op:
        return "different-op"
    if a.op not in ("all_to_all", "all_to_all_single", "scatter", "gather") and a.sizes != b.sizes:
        return "different-sizes"
    if a.op not in ("scatter", "gather", "broadcast") and set(a.dtypes) != set(b.dtypes) and a.sizes and b.sizes:
        return "different-sizes"
    return None


def divergence(ledgers: dict[int, tuple[Collective, ...]]) -> Divergence | None:
    """The first collective number at which the ranks' ledgers differ (op or sizes), else the
    first number some rank has not reached while another has; None when they agree.

    Only numbers every ledger still holds are compared (the flight recorder is a ring buffer)."""
    ranks = sorted(r for r, l in ledgers.items() if l)
    if len(ranks) < 2:
        return None
    by_pg: dict[str, dict[int, dict[int, Collective]]] = {}
    for r in ranks:
        for c in ledgers[r]:
            by_pg.setdefault(c.pg, {}).setdefault(r, {})[c.seq] = c
    found = []
    for pg, per_rank in by_pg.items():
        if len(per_rank) < len(ranks):
            continue  # a group not every rank is in (new_group of a subset)
        first = max(min(s) for s in per_rank.values())
        last = {r: max(s) for r, s in per_rank.items()}
        for seq in range(first, max(last.values()) + 1):
            here = {r: per_rank[r].get(seq) for r in ranks}
            have = [c for c in here.values() if c is not None]
            ops = {r: (c.op if c else None) for r, c in here.items()}
            sizes = {r: (c.sizes if c else None) for r, c in here.items()}
            kinds = {match(have[0], c) for c in have[1:]} - {None}
            if kinds:
                kind = "different-op" if "different-op" in kinds else "different-sizes"
                found.append(Divergence(kind, seq, pg, ops, sizes, last))
                break
            if len(have) < len(ranks):
                found.append(Divergence("shorter-ledger", seq, pg, ops, sizes, last))
                break
    return min(found, key=lambda d: (d.pg != "0", d.seq)) if found else None
