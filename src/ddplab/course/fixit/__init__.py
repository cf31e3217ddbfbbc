"""Fix-it exercises: a short broken script of one lab's failure class, repaired by the learner in a
``%%ddplab`` cell and judged for real by ``grade`` (see ``ddplab.course.fixit.grader``).

    %load_ext ddplab
    from ddplab.course import fixit
    print(fixit.get("01").broken)           # what the notebook's %%ddplab cell holds
    fixit.grade("01", attempt)              # attempt: the RunResult of `%%ddplab --name attempt`

The exercises are data (``Exercise``: id, lab, broken source, reference fix, hint, wrong fixes with their
feedback, ranks, tolerance); each lives in its own module ``exNN``. The reference fix and the accepted
results live here, in the package, never in a notebook.
"""
from __future__ import annotations

from importlib import import_module

from ddplab.errors import DdplabError
from ddplab.course.fixit.exercise import Attempt, Edit, Exercise, Mismatch, WrongFix  # noqa: F401
from ddplab.course.fixit.grader import Grade, Level, Outcome, grade, reset, settings  # noqa: F401

# One module per exercise, in lab order.
MODULES = ("ex01", "ex03", "ex04", "ex06", "ex08", "ex10", "ex12")


def exercises() -> tuple[Exercise, ...]:
    return tuple(import_module(f"{__name__}.{m}").EXERCISE for m in MODULES)


def get(exercise_id: str) -> Exercise:
    for ex in exercises():
        if ex.id == str(exercise_id):
            return ex
    known = ", ".join(ex.id for ex in exercises())
    raise DdplabError(f"no fix-it exercise {exercise_id!r}", hint=f"use one of {known}")
