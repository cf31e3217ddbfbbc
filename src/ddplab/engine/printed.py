"""What the ranks printed, compared across ranks (issue 41): the same labelled quantity with different values.

Each rank's own output (stdout and stderr, ``RunEvidence.logs``) is read line by line for labelled quantities,
by their shape, never by a list of names: ``name: value``, ``name=value``, ``'name': value`` and ``name value``,
where the value is a number (``0.1``, ``3e-4``, ``12/40``) or a path (a token with a ``/`` and a letter). A
quantity is keyed by the line it stands in, with every value and digit masked (its *shape*: ``epoch # | lr #``),
its place in that line, and the occurrence: the k-th time the rank printed a line of that shape. So "epoch 3 lr
0.1" on one rank meets "epoch 3 lr 0.2" on another, and a line only some ranks print (rank 0's log line) meets
nothing. This reads the user's output as evidence; ddplab's own text is never read back. Lines of tracebacks,
Python warnings and torch's C++ log lines (``W1206 09:43:34.1 ...``) are not read.

A difference is a fact only where the quantity reads as one the ranks share, from the values alone:

- values equal to the rank's own number, its local rank or its pid (``rank 0``/``rank 1``, ``cuda:1``, a path
  holding the rank number) are each rank's identity, not a difference;
- a quantity that differs at every aligned occurrence and changes within every rank (each rank's loss on its
  own shard, a time) is measured per rank by nature: nothing;
- it is shared when some rank printed one value at every aligned occurrence (``held``: a setting, lr 0.1 on
  one rank and 0.2 on the other, or a scheduler stepped on one rank only, where the others keep the first
  value), or when every rank printed the same value at the first two or more occurrences before it parted
  (``agreed``: a schedule computed per rank that drifts), or, printed once, when it is a path, or when its
  line holds three or more other quantities, all of which every rank printed alike (a configuration line);
- the same values printed more times on some ranks is a difference (``count``) only where a rank that
  printed fewer ended on its own (exit 0, no error): a rank that failed or was stopped printed less because
  it stopped.

The result is ``facts.PrintedDiff`` data, most specific first; sentences are made in ``ddplab.views``. It is
evidence, never a cause: the engine names no catalog entry from it. ``qualify`` gives a ``--check`` finding
whose fix the printed values show does not reach its cause (replicas that parted while the ranks printed a
setting with different values) the fix for that reason (``facts.CHECK_CAUSE_FIXES``).
"""
from __future__ import annotations

import re
from dataclasses import replace
from typing import Mapping

from ddplab.facts import CheckReport, PrintedAt, PrintedDiff

_NUM = r"[-+]?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)?"
_PATH = r"(?:~|\.{1,2})?/[^\s'\",;()\[\]{}<>|]+|[A-Za-z0-9_.\-]+/[^\s'\",;()\[\]{}<>|]+"
_LABEL = r"[A-Za-z_][A-Za-z0-9_.\-]*"
# a label, a separator, maybe a tensor( or [ around a number, the value; a value must end where a token ends (not
# inside a time of day 09:43:34, a date 2026-12-06 or a version 2.13.0)
_PAIR = re.compile(
    rf"(?<![\w.\-/])['\"]?(?P<label>{_LABEL})['\"]?(?:\s*[:=]\s*|\s+)(?:tensor\()?[\['\"]?"
    rf"(?P<value>(?P<num>{_NUM}(?:/{_NUM})?)(?![\d.]|[:/\-]\d)|(?P<path>{_PATH}))")
_DIGITS = re.compile(r"\d+")
_PREFIX = re.compile(r"^\[rank\d+\]:")
_GLOG = re.compile(r"^\[?[IWEF]\d{4} \d\d:\d\d:\d\d")
_WARNING = re.compile(r"\b\w*Warning: ")
MAX_LINES = 20_000          # lines read per rank (the first ones: a setting is printed early)
MAX_DIFFS = 8               # differences kept, most specific first
TEXT = 160                  # characters of a line kept


def _lines(text: str):
    """(line number, line) of a rank's output that are the user's own prints: no traceback, no warning, no
    torch C++ log line."""
    in_tb = False
    for n, line in enumerate((text or "").splitlines()[:MAX_LINES], 1):
        line = _PREFIX.sub("", line, count=1)     # torch's "[rank0]:" before each line of a rank's stderr
        s = line.strip()
        if not s:
            continue
        if s.startswith("Traceback (most recent call last)") or s.startswith("During handling of the above") \
                or s.startswith("The above exception was the direct cause"):
            in_tb = True
            continue
        if in_tb:
            if line[:1].isspace():
                continue
            in_tb = False      # the exception's own line ends it
            continue
        if _GLOG.match(s) or _WARNING.search(s):
            continue
        yield n, line


def _streams(output) -> list[tuple[str, str]]:
    """(stream, text) of a rank's output: its stdout then its stderr where they are apart, else one text."""
    if isinstance(output, str):
        return [("", output)]
    return [(name, output[name]) for name in sorted(output, key=lambda n: (n != "stdout", n)) if output[name]]


def quantities(output) -> dict[tuple[str, int], list[tuple[str, str, tuple[str, int], str, bool]]]:
    """A rank's labelled quantities (its output: a text, or {"stdout": text, "stderr": text}): {(line shape, place
    in the line): [(label, value, (stream, line number), line, is a number), ... in the order printed]}. The k-th
    entry of a list is the k-th print of that shape."""
    out: dict[tuple[str, int], list] = {}
    for stream, text in _streams(output):
        _read(stream, text, out)
    return out


def _read(stream: str, text: str, out: dict) -> None:
    for n, line in _lines(text):
        found = [m for m in _PAIR.finditer(line) if not m.group("path") or re.search("[A-Za-z]", m.group("path"))]
        if not found:
            continue
        shape, last = [], 0
        for m in found:
            shape.append(_DIGITS.sub("#", line[last:m.start("value")]))
            shape.append("<v>")
            last = m.end("value")
        shape.append(_DIGITS.sub("#", line[last:]))
        key = "".join(shape).strip()
        for j, m in enumerate(found):
            value = m.group("value").rstrip(".") if m.group("path") else m.group("value")
            out.setdefault((key, j), []).append((m.group("label"), value, (stream, n), line.strip()[:TEXT],
                                                 m.group("num") is not None))


def _identity(value: str, numeric: bool, ids: tuple[int, ...]) -> str:
    """The value with the rank's own numbers (rank, local rank, pid) masked: what is left is what the ranks share."""
    if numeric:
        try:
            return "<id>" if float(value) in ids else value
        except ValueError:
            return value
    return _DIGITS.sub(lambda m: "<id>" if int(m.group()) in ids else m.group(), value)


def _same(values: list[str], numerics: list[bool], ids: dict[int, tuple[int, ...]], ranks: list[int]) -> bool:
    if len(set(values)) == 1:
        return True
    masked = {_identity(v, n, ids[r]) for v, n, r in zip(values, numerics, ranks)}
    return len(masked) == 1


def compare(logs: Mapping[int, "str | Mapping[str, str]"], ids: Mapping[int, tuple[int, ...]] | None = None,
            ended_clean: frozenset[int] | set[int] = frozenset()) -> tuple[PrintedDiff, ...]:
    """The labelled quantities the ranks printed with different values, most specific first (a value before a
    count, then the earliest first disagreement). ``logs``: each rank's output, one text or its streams apart;
    ``ids``: each rank's own numbers (its rank, local rank, pid); ``ended_clean``: the ranks that ended on their
    own (exit 0, no error), whose shorter output is a fact."""
    ranks = sorted(r for r, t in logs.items() if t)
    if len(ranks) < 2:
        return ()
    ids = {r: tuple((ids or {}).get(r, ())) or (r,) for r in ranks}
    per = {r: quantities(logs[r]) for r in ranks}
    keys = sorted({k for q in per.values() for k in q})
    found: list[tuple[tuple, PrintedDiff]] = []
    for key in keys:
        have = [r for r in ranks if key in per[r]]
        if len(have) < 2:
            continue                      # a line only one rank prints (rank 0's log line)
        seqs = {r: per[r][key] for r in have}
        m = min(len(s) for s in seqs.values())
        differs = [k for k in range(m) if not _same([seqs[r][k][1] for r in have], [seqs[r][k][4] for r in have],
                                                   ids, have)]
        held = m >= 2 and any(len({seqs[r][k][1] for k in range(m)}) == 1 for r in have)
        numeric = all(seqs[r][0][4] for r in have)
        if differs:
            k0 = differs[0]
            agreed = k0                   # every aligned occurrence before it agreed
            if not (held or agreed >= 2 or (m == 1 and (not numeric or _configuration(key, per, have)))):
                continue                  # measured per rank (a loss, a time) or nothing shows it is shared
            base = seqs[have[0]][k0][1]
            first = next(r for r in have if not _same([base, seqs[r][k0][1]], [seqs[have[0]][k0][4], seqs[r][k0][4]],
                                                      ids, [have[0], r]))
            diff = PrintedDiff(seqs[have[0]][k0][0], "value", k0, _at(seqs, have, k0), first, agreed, held, numeric,
                               numeric and _offset([seqs[r][k0][1] for r in have], have))
            found.append(((0, _order(seqs[first][k0][2])), diff))
            continue
        counts = {r: len(s) for r, s in seqs.items()}
        if len(set(counts.values())) > 1:
            fewer = [r for r in have if counts[r] == m]
            if not all(r in ended_clean for r in fewer):
                continue                  # a rank that failed or was stopped printed less because it stopped
            first = next(r for r in have if counts[r] > m)
            diff = PrintedDiff(seqs[have[0]][0][0], "count", m, _at(seqs, have, m), first, m, held, numeric)
            found.append(((1, _order(seqs[first][m][2])), diff))
    found.sort(key=lambda kv: kv[0])
    kept: dict[tuple, PrintedDiff] = {}
    for _, d in found:
        # the same values under the same label on another line (a configuration line, then every epoch's line): one
        # fact, the first line's, read as shared as any of its lines shows it
        sig = (d.label, d.kind, tuple((v.rank, v.value) for v in d.values))
        k = kept.get(sig)
        kept[sig] = d if k is None else replace(k, held=k.held or d.held, agreed=max(k.agreed, d.agreed))
    return tuple(list(kept.values())[:MAX_DIFFS])


def from_run(run, ended_clean=frozenset()) -> tuple[PrintedDiff, ...]:
    """``compare`` over what a job left behind (``evidence.RunEvidence``): each rank's stdout and stderr apart
    where they are, and its own numbers from its start record (rank, local rank, pid)."""
    ids = {}
    for r in run.logs:
        own = [r]
        for key in ("local_rank", "pid"):
            try:
                own.append(int((run.infos.get(r) or {})[key]))
            except (KeyError, TypeError, ValueError):
                pass
        ids[r] = tuple(own)
    return compare({r: run.streams.get(r) or t for r, t in run.logs.items()}, ids, ended_clean)


def _order(where: tuple[str, int]) -> tuple:
    """Where a line stands, for "earliest": stdout before stderr, then its line number."""
    return where[0] not in ("", "stdout"), where[0], where[1]


def _configuration(key, per, have) -> bool:
    """A line printed once whose other quantities (three or more) every rank printed alike: a configuration."""
    shape, slot = key
    others = [k for k in per[have[0]] if k[0] == shape and k[1] != slot]
    alike = [k for k in others if all(k in per[r] and per[r][k][0][1] == per[have[0]][k][0][1] for r in have)]
    differ = [k for k in others if k not in alike]
    return len(alike) >= 3 and not differ


def _offset(values: list[str], ranks: list[int]) -> bool:
    """Every rank's value is the lowest rank's plus the difference of their rank numbers (a seed offset by the
    rank, as nanoGPT's ``1337 + seed_offset``): a per-rank value that may be meant."""
    try:
        nums = [float(v) for v in values]
    except ValueError:
        return False
    return all(n - nums[0] == r - ranks[0] for n, r in zip(nums, ranks))


def _at(seqs, have, k) -> tuple[PrintedAt, ...]:
    out = []
    for r in have:
        s = seqs[r]
        if k < len(s):
            out.append(PrintedAt(r, s[k][1], s[k][2][1], s[k][3], len(s), s[k][2][0]))
        else:
            out.append(PrintedAt(r, None, None, "", len(s)))
    return tuple(out)


def setting(d: PrintedDiff) -> bool:
    """A difference that reads as a setting the ranks stepped with: a number, printed more than once, that some
    rank held at every print or every rank printed alike before it parted, and not the rank's own offset."""
    return d.kind == "value" and d.numeric and (d.held or d.agreed >= 2) and not d.by_rank


def qualify(report: CheckReport | None, diffs: tuple[PrintedDiff, ...]) -> CheckReport | None:
    """A ``replicas-differ`` finding whose fix (steps through the wrapper, weights loaded before it) the ranks'
    own output shows may not reach its cause: they printed a number shared in shape (a setting) with different
    values. Its cause becomes ``printed-setting-differs`` and its values the printed ones: each rank stepped with
    the same averaged gradients and its own value, which no step through the wrapper makes equal."""
    if report is None or not report.findings:
        return report
    d = next((d for d in diffs if setting(d)), None)
    if d is None:
        return report
    findings = tuple(
        replace(f, cause="printed-setting-differs", label=d.label,
                values=tuple((v.rank, v.value) for v in d.values if v.value is not None))
        if f.kind == "replicas-differ" and f.cause is None else f for f in report.findings)
    return replace(report, findings=findings)
