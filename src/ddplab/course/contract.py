"""The contract every workbook module (`ddplab.course.labNN`) keeps, as a Protocol, and a check of a
module against it by signature (not by names only): tests/test_workbook_contract.py runs it on every
module, and a new lab's module is written against it (docs/adding-a-lab.md)."""
from __future__ import annotations

import inspect
from typing import Any, Mapping, Protocol, runtime_checkable

from ddplab.course import answers, claims
from ddplab.errors import DdplabError
from ddplab.result import RunResult


@runtime_checkable
class WorkbookLab(Protocol):
    """A lab's workbook module. ``LAB``: its number ("01"); its facts (article, variants, outcomes)
    come from the catalog, never re-declared here."""
    LAB: str
    EXERCISES: Mapping[str, answers.Exercise]

    def validate(self, **knobs: Any) -> None:
        """Refuse a bad request (unknown knob, impossible value) with a DdplabError before any rank starts."""

    def run_variant(self, variant: str, **knobs: Any) -> RunResult:
        """One real run of ``variant`` with these knobs (the lab's own, and the launcher's: nproc, stall_s, ...)."""

    def claim_inputs(self, runs: Mapping[str, RunResult]) -> claims.Inputs:
        """What ``runs`` measured for the register's claims (ddplab.course.claim_register), judged there. ``runs``:
        a variant's run under its variant name; anything else a lab reads (a sweep, rows, a dataclass) under
        a descriptive key that its docstring names."""


def launcher_knobs() -> set[str]:
    """The keywords every run_variant passes on to `ddplab.run` (nproc, stall_s, run_root, ...)."""
    from ddplab.front import run

    return {p for p in inspect.signature(run).parameters if p not in ("target", "variant")}


def _named(fn) -> set[str]:
    return {n for n, p in inspect.signature(fn).parameters.items()
            if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}


def declared(lab: Mapping | str) -> dict:
    """The knobs a lab script declares (``LAB["knobs"]``): from its LAB dict, or from its number
    through the catalog (read by ast, without torch)."""
    if isinstance(lab, str):
        from ddplab.origins import catalog

        found = catalog.find_lab(lab)
        return dict(found.extra.get("knobs", {})) if found else {}
    return dict(lab.get("knobs", {}))


def validate_knobs(lab: str, knobs: Mapping[str, Any], *takers) -> None:
    """Every workbook module's validate(): an unknown knob is refused by name (the script's declared
    knobs, ``takers``' parameters and the launcher's are known), then each script knob's value is
    checked against its one declaration (``LAB["knobs"]`` of the script, ddplab.rank.lab_args)."""
    from ddplab.rank import lab_args

    decl = declared(lab)
    known = set(decl).union(*map(_named, takers), launcher_knobs()) - {"variant"}
    unknown = sorted(set(knobs) - known)
    if unknown:
        raise DdplabError(f"unknown knob(s) {', '.join(unknown)}",
                          hint="the knobs are: " + ", ".join(sorted(known)))
    for name in decl.keys() & knobs.keys():
        try:
            lab_args.coerce(name, decl[name], knobs[name])
        except ValueError as e:
            spec = decl[name]
            raise DdplabError(f"lab {lab}: {e}",
                              hint=f"{name} is {spec.get('help')} (default {spec.get('default')!r})") from None


def script_args(lab: str, kw: Mapping[str, Any]) -> tuple[list[str], dict]:
    """(the script's command line for the declared knobs in ``kw``, the rest of ``kw`` for ddplab.run).
    Call validate first: a value is checked again here only as the argv is made."""
    from ddplab.rank import lab_args

    decl = declared(lab)
    mine = {k: v for k, v in kw.items() if k in decl}
    rest = {k: v for k, v in kw.items() if k not in decl}
    return lab_args.argv(decl, mine) + list(rest.pop("args", ())), rest


def _returns(fn, name: str) -> bool:
    ann = inspect.signature(fn).return_annotation
    text = ann if isinstance(ann, str) else getattr(ann, "__name__", str(ann))
    return name in str(text)


def problems(module) -> list[str]:
    """What ``module`` lacks or has with the wrong signature; empty when it keeps the contract."""
    out = []
    lab = getattr(module, "LAB", None)
    if not (isinstance(lab, str) and len(lab) == 2 and lab.isdigit()):
        out.append(f"LAB must be a two-digit string, not {lab!r}")

    validate = getattr(module, "validate", None)
    if not callable(validate):
        out.append("validate(**knobs) is missing")
    else:
        ps = inspect.signature(validate).parameters.values()
        if not any(p.kind is p.VAR_KEYWORD for p in ps):
            out.append("validate must take **knobs (any knob, refused by name when unknown)")
        if any(p.default is p.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
               for p in ps):
            out.append("validate's knobs must all have defaults (validate() with none is valid)")
        if inspect.signature(validate).return_annotation not in (None, "None"):
            out.append("validate returns None (it raises DdplabError)")

    run_variant = getattr(module, "run_variant", None)
    if not callable(run_variant):
        out.append("run_variant(variant, **knobs) is missing")
    else:
        ps = list(inspect.signature(run_variant).parameters.values())
        if not ps or ps[0].name != "variant" or ps[0].default is not ps[0].empty:
            out.append("run_variant's first parameter is `variant` (required)")
        if not any(p.kind is p.VAR_KEYWORD for p in ps):
            out.append("run_variant must take **knobs (the launcher's: nproc, stall_s, run_root, ...)")
        if any(p.default is p.empty for p in ps[1:] if p.kind is not p.VAR_KEYWORD and p.kind is not p.VAR_POSITIONAL):
            out.append("run_variant's knobs must all have defaults")
        if not _returns(run_variant, "RunResult"):
            out.append("run_variant is annotated to return a RunResult")

    exercises = getattr(module, "EXERCISES", None)
    if not isinstance(exercises, Mapping) or not exercises:
        out.append("EXERCISES must be a non-empty mapping {key: answers.Exercise}")
    else:
        for key, ex in exercises.items():
            if not isinstance(ex, answers.Exercise) or ex.key != key:
                out.append(f"EXERCISES[{key!r}] must be the answers.Exercise with key {key!r}")
                continue
            ps = list(inspect.signature(ex.judge).parameters.values())
            if not ps or ps[0].name != "answer":
                out.append(f"{key}: its judge takes the parsed `answer` first")
            if not _returns(ex.judge, "Check"):
                out.append(f"{key}: its judge returns a Check")
            if not isinstance(ex.kind, answers.Kind):
                out.append(f"{key}: its kind must be an answers.Kind")

    claim_inputs = getattr(module, "claim_inputs", None)
    if not callable(claim_inputs):
        out.append("claim_inputs(runs) is missing")
    else:
        ps = list(inspect.signature(claim_inputs).parameters.values())
        if len(ps) != 1 or ps[0].name != "runs" or ps[0].default is not ps[0].empty:
            out.append("claim_inputs takes one argument, `runs: Mapping[str, RunResult]`")
        if not _returns(claim_inputs, "Inputs"):
            out.append("claim_inputs is annotated to return a claims.Inputs")
    return out
