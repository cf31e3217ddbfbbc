"""The fix-it exercises, one module each (``exNN``), found by id."""
from __future__ import annotations

from importlib import import_module

from ddplab.course.fixit.exercise import Exercise
from ddplab.errors import DdplabError

# One module per exercise, in lab order.
MODULES = ("ex01", "ex02", "ex03", "ex04", "ex05", "ex06", "ex07", "ex08", "ex09", "ex10", "ex11", "ex12")


def exercises() -> tuple[Exercise, ...]:
    return tuple(import_module(f"ddplab.course.fixit.{m}").EXERCISE for m in MODULES)


def get(exercise_id: str) -> Exercise:
    for ex in exercises():
        if ex.id == str(exercise_id):
            return ex
    known = ", ".join(ex.id for ex in exercises())
    raise DdplabError(f"no fix-it exercise {exercise_id!r}", hint=f"use one of {known}")
