"""The answers every checker is tried with, made in one place from what a lab supplies (the right
answer and its neighbour, and where they apply the other rank and the value a parameters cell
shows): right, the right answer as a learner may spell or type it (other case, '-' or no '_',
a module before a name, numpy's scalars, 17.0 for 17), wrong, empty, wrong type, the neighbouring
value, the other rank, the value a parameters cell shows, and a list of all the options. Only the
right answers (in any spelling) may pass."""
from __future__ import annotations

from ddplab.course import answers
from ddplab.course.answers import Exercise

NA = object()   # "does not apply to this exercise"


def _wrong_types(kind: answers.Kind, right) -> list:
    if isinstance(kind, (answers.Choice,)):
        return [1, [right], b"x"]
    if isinstance(kind, answers.Options):
        return [sorted(right)[0] if right else "x", 3]
    if isinstance(kind, answers.Pair):
        return [str(right), list(right) + [0], right[0]]
    if isinstance(kind, answers.Ranks):
        return [right[0] if right else 0, str(list(right)), [True]]
    if isinstance(kind, answers.Number):
        return [str(right), True, float("nan"), [right]]
    return [str(right), float(right) + 0.5, True, [right]]   # Whole, Rank


def _spelled(kind: answers.Kind, right) -> list:
    """``right`` as a learner may also write it; each must pass as ``right`` does."""
    import numpy as np
    if isinstance(kind, answers.Choice):
        r = right.strip()
        return [r.upper(), r.replace("_", ""), "torch.distributed." + r, f" {r.title()} "]
    if isinstance(kind, answers.Options):
        return [{v.strip().upper() for v in right}, sorted(right)]
    if isinstance(kind, (answers.Whole, answers.Rank)):
        return [np.int64(right), float(right), np.float32(right)]
    if isinstance(kind, answers.Number) and not isinstance(right, str):
        return [np.float64(right)] + ([int(right)] if float(right).is_integer() else [])
    if isinstance(kind, answers.Ranks):
        return [[np.int64(r) for r in right], set(right)]
    if isinstance(kind, answers.Pair):
        return [(a, b) for a, b in zip(_spelled(kind.first, right[0]), _spelled(kind.second, right[1]))]
    return []


def _all_options(kind: answers.Kind):
    if isinstance(kind, answers.Choice):
        return list(kind.options)
    if isinstance(kind, answers.Options):
        return None   # a set of every option is an answer of its kind: tried as `wrong` where it is wrong
    if isinstance(kind, answers.Whole) and kind.only:
        return list(kind.only)
    if isinstance(kind, answers.Rank):
        return list(range(kind.nproc))
    if isinstance(kind, answers.Pair) and isinstance(kind.first, answers.Choice):
        return list(kind.first.options)
    return None


def _key(value):
    """A value compared by type and equality (True == 1, but True is no rank), never by its repr: two
    equal sets may list their items in different orders (string hashes differ from run to run)."""
    if isinstance(value, (set, frozenset)):
        return (type(value).__name__, frozenset(map(_key, value)))
    if isinstance(value, (list, tuple)):
        return (type(value).__name__, tuple(map(_key, value)))
    if isinstance(value, dict):
        return ("dict", frozenset((_key(k), _key(v)) for k, v in value.items()))
    try:
        hash(value)
    except TypeError:
        return (type(value).__name__, repr(value))
    return (type(value).__name__, value)


def cases(ex: Exercise, right, neighbour, *, other_rank=NA, shown=NA, wrong=()) -> list[tuple[str, object, bool]]:
    """(label, answer, passes) for every case; ``right`` may be one answer or a list of them (an empty
    list where only a real run of the learner's answer can pass, tried in a test of its own)."""
    rights = right if isinstance(right, list) else [right]
    out = [("right", r, True) for r in rights]
    out += [("right, spelled otherwise", s, True) for r in rights if r is not None for s in _spelled(ex.kind, r)]
    out += [("empty", e, False) for e in (None, "", "   ", [], ())
            if not (isinstance(ex.kind, answers.Options) and e in ([], ()))]
    out += [("wrong type", w, False) for w in _wrong_types(ex.kind, rights[0] if rights else neighbour)]
    out += [("neighbour", neighbour, False)]
    if other_rank is not NA:
        out.append(("other rank", other_rank, False))
    if shown is not NA:
        out.append(("parameters cell", shown, False))
    options = _all_options(ex.kind)
    if options is not None:
        out.append(("all options", options, False))
    out += [("wrong", w, False) for w in wrong]
    for label, a, passes in out:
        same = any(_key(a) == _key(r) for r in rights)
        assert passes or not same, f"{ex.key}: the {label} case {a!r} is a right answer"
    return out


def check_all(ex: Exercise, *runs, right, neighbour, other_rank=NA, shown=NA, wrong=(), **kw) -> None:
    """Every case through the checker (stateless: `Exercise.check`); only the right answers pass, and
    the answers it accepts (its `accepted`, where it names them) are the right ones."""
    bad = []
    for label, answer, passes in cases(ex, right, neighbour, other_rank=other_rank, shown=shown, wrong=wrong):
        c = ex._verdict(answer, *runs, **kw)
        if c.passed != passes or not c.message.strip():
            bad.append(f"{label} {answer!r}: {'PASS' if c.passed else 'NOT YET'} {c.message}")
        if label == "empty" and not c.message.startswith(f"set `{ex.name}`"):
            bad.append(f"empty {answer!r} is not answered with the common wording: {c.message}")
    accepted = list(ex.accepted(*runs, **kw))
    rights = right if isinstance(right, list) else [right]
    if accepted and not all(isinstance(a, answers.Interval) for a in accepted):
        if set(map(_key, accepted)) != {_key(ex.kind.parse(r, ex.name)) for r in rights}:
            bad.append(f"accepted {accepted!r} is not the right answers {rights!r}")
    assert not bad, f"{ex.key}:\n" + "\n".join(bad)


def check_best_fix(L, frows: list) -> list:
    """Lab 07's best-fix checker on one fixes run's rows (``L``: ddplab.course.lab07): right, every fix
    within the checker's noise of the best speedup measured in this run (which fixes those are depends on
    this machine's run); wrong, the others, whichever they are here. Returns those others."""
    best = L.best_fix(frows)
    close = [r["fix"] for r in frows if r["fix"] in L.FIXES
             and (r["fix"] == best["fix"] or r["speedup"] >= L.WITHIN_BEST * best["speedup"])]
    far = [r["fix"] for r in frows if r["fix"] in L.FIXES and r["fix"] not in close]
    check_all(L.check_best_fix, frows, right=close + [f" {best['fix'].upper()} "],
              neighbour=far[0] if far else "none", shown="1024",
              wrong=far[1:] + ["bat", best["fix"][:-1], best["label"], "none"])
    return far
