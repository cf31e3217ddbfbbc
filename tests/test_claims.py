"""The claims register (ddplab.course.claim_register) and its rules of judgement (ddplab.course.claims): each article
sentence once, found word for word in its article (where the articles are beside the checkout), every
sentence a notebook quotes registered, one verdict per sentence across the stored notebooks, and the
rules tested on constructed parts."""
import importlib
import itertools
import json
import re
from pathlib import Path

import pytest

from ddplab.course import articles, claim_register, claims
from ddplab.course import lab09

ROOT = Path(__file__).resolve().parents[1]
LABS = sorted(p.stem[3:] for p in (ROOT / "src" / "ddplab" / "course").glob("lab[0-9][0-9].py"))
NOTEBOOKS = {p.name[:2]: p for p in sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb")) if p.name[:2] != "00"}


def _quotes() -> list[str]:
    return [articles.normalise(c.quote) for c in claims.register().values()]


def test_each_sentence_is_registered_once():
    keys = [c.key for c in claim_register.REGISTER]
    assert len(keys) == len(set(keys))
    quotes = _quotes()
    twice = [a for a, b in itertools.permutations(quotes, 2) if a in b]
    assert not twice, f"registered twice (one quotation inside another): {twice}"
    for c in claim_register.REGISTER:
        assert c.article in articles.ARTICLES and c.criterion.strip(), c.key
        assert 20 <= len(c.quote) <= 400, f"{c.key}: quote a sentence (or part of one), not a passage"
        assert c.labs and set(c.labs) <= set(LABS), c.key
        named = [n for names in c.parts.values() for n in names] + list(c.unmeasured)
        assert named and len(named) == len(set(named)), f"{c.key}: parts are named once"
        assert set(c.decisive) <= set(named), c.key


def test_every_register_quotation_is_word_for_word():
    if articles.articles_dir() is None:
        pytest.skip("the articles are not beside this checkout (set DDPLAB_ARTICLES_DIR to check quotations)")
    wrong = [c.key for c in claim_register.REGISTER if not articles.quoted_in(c.quote, c.article)]
    assert not wrong, f"not found word for word in their article: {wrong}"


def _blockquotes(nb: dict) -> list[str]:
    """Each quoted paragraph of the notebook's markdown (lines starting with '>')."""
    out = []
    for cell in nb["cells"]:
        if cell["cell_type"] != "markdown":
            continue
        text = "".join(cell["source"])
        for block in re.findall(r"(?:^>.*\n?)+", text, re.M):
            lines = [re.sub(r"^>\s?", "", l) for l in block.splitlines()]
            out += [" ".join(p) for k, p in itertools.groupby(lines, key=lambda l: bool(l.strip())) if k]
            out = [p for p in out if p]
    return out


@pytest.mark.parametrize("lab", sorted(NOTEBOOKS))
def test_every_quoted_sentence_is_in_the_register(lab):
    """Every sentence a notebook quotes (its markdown's block quotes) is a register quotation, and every
    quotation its claim table shows (the table's data) is one too."""
    nb = json.loads(NOTEBOOKS[lab].read_text())
    registered = _quotes()
    for para in _blockquotes(nb):
        rest = articles.normalise(para)
        for q in sorted(registered, key=len, reverse=True):
            rest = rest.replace(q, "")
        assert not re.sub(r"[\s\"“”'.,;:()\-]", "", rest), f"{NOTEBOOKS[lab].name} quotes {para!r}, not in the register"
    out = claims._claim_output(nb)
    shown = [r["quote"] for r in out["data"][claims.MIME]["rows"]] if out else []
    assert all(articles.normalise(q) in registered for q in shown)


def test_the_quotation_check_sees_a_quoted_sentence():
    nb = {"cells": [{"cell_type": "markdown", "source": ["Intro\n", "> \"A made-up sentence.\n", "> Another.\"\n",
                                                         ">\n", "> `code()`\n"]}]}
    assert _blockquotes(nb) == ['"A made-up sentence. Another."', "`code()`"]


@pytest.mark.parametrize("lab", LABS)
def test_each_lab_supplies_the_register_its_parts(lab):
    m = importlib.import_module(f"ddplab.course.lab{lab}")
    assert callable(m.claim_inputs) and not hasattr(m, "CLAIMS") and not hasattr(m, "claim_check")
    assert claims.for_lab(lab), f"lab {lab} quotes no registered claim"


def test_one_verdict_per_sentence_across_the_stored_notebooks():
    """Read from each stored notebook's claim table data (not its prose): a sentence shown in two
    notebooks has one verdict. Fails until the notebooks are executed with the register."""
    verdicts, missing = {}, []
    for lab, path in NOTEBOOKS.items():
        out = claims._claim_output(json.loads(path.read_text()))
        if out is None:
            missing.append(path.name)
            continue
        data = out["data"][claims.MIME]
        assert [r["key"] for r in data["rows"]] == [c.key for c in claims.for_lab(lab)], path.name
        for r in data["rows"]:
            verdicts.setdefault(r["key"], {})[lab] = r["verdict"]
    assert not missing, f"no claim table data in {missing}: execute them (make notebooks)"
    split = {k: v for k, v in verdicts.items() if len(set(v.values())) > 1}
    assert not split, f"one sentence, several verdicts: {split}"


# ---- the rules, on constructed parts ----

def test_all_measured_parts_decide():
    assert claims.verdict({"a": claims.HOLDS, "b": claims.HOLDS}) == "holds"
    assert claims.verdict({"a": claims.HOLDS, "b": claims.FAILS}) == "partly"
    assert claims.verdict({"a": claims.FAILS, "b": claims.FAILS}) == "wrong"


def test_a_part_not_measured_is_never_holds_or_wrong():
    assert claims.verdict({"a": claims.HOLDS, "b": claims.NOT_MEASURED}) == "partly"
    assert claims.verdict({"a": claims.FAILS, "b": claims.NOT_MEASURED}) == "partly"
    assert claims.verdict({"a": claims.NOT_MEASURED}) == "not tested here"
    unresolved = (claims.NOT_MEASURED, claims.STAND_IN, claims.NOT_ESTABLISHED)
    every = (claims.HOLDS, claims.FAILS) + unresolved
    for states in itertools.product(every, repeat=3):
        if set(states) & set(unresolved):
            assert claims.verdict(dict(zip("abc", states))) not in ("holds", "wrong"), states


def test_a_stand_in_judges_nothing():
    part = claims.stand_in("an RLIMIT cap on host memory, not the GPU's")
    assert part.state == claims.STAND_IN and part.holds is None
    assert claims.verdict({"a": part.state}) == "not tested here"
    assert claims.verdict({"a": part.state, "b": claims.HOLDS}) == "partly"


def test_a_statistical_part_decides_only_at_its_level():
    assert claims.test(0.01).state == claims.HOLDS
    assert claims.test(0.194).state == claims.NOT_ESTABLISHED            # lab 10's sign test before the register
    assert claims.test(0.194, p_against=0.01).state == claims.FAILS       # shown the other way
    assert claims.test(0.04, level=0.01).state == claims.NOT_ESTABLISHED
    three_hold = {"deadlock": claims.HOLDS, "states": claims.HOLDS, "errors": claims.HOLDS}
    assert claims.verdict({**three_hold, "slow": claims.test(0.194).state}) == "not established"
    assert claims.verdict({"slow": claims.NOT_ESTABLISHED}) == "not established"
    assert claims.verdict({"a": claims.FAILS, "slow": claims.NOT_ESTABLISHED, "b": claims.HOLDS}) == "partly"


def test_a_decisive_part_shown_false_makes_it_wrong():
    states = {"incorrect_results": claims.HOLDS, "hang": claims.FAILS}
    assert claims.verdict(states) == "partly"
    assert claims.verdict(states, decisive=("hang",)) == "wrong"
    assert claims.verdict({"a": claims.HOLDS, "hang": claims.NOT_MEASURED}, decisive=("hang",)) == "partly"


@pytest.fixture
def two_labs(monkeypatch):
    """A register of two labs ("98", "99") that share one sentence."""
    reg = (claims.Claim("shared", "000", "x" * 30, "both", parts={"98": ("a",), "99": ("b",)}),
           claims.Claim("own", "000", "y" * 30, "one", parts={"98": ("c",)}, unmeasured={"d": "a frequency"}))
    monkeypatch.setattr(claim_register, "REGISTER", reg)
    return (claims.Inputs("98", {"shared": claims.evidence("ran a", a=True), "own": claims.evidence("ran c", c=True)}),
            claims.Inputs("99", {"shared": claims.evidence("ran b", b=claims.test(0.5))}))


def test_a_row_is_judged_from_every_lab(two_labs):
    i98, i99 = two_labs
    alone = claims.check(i98, others={})
    assert alone.verdicts() == {"shared": "partly", "own": "partly"}
    assert alone.row("shared").parts["b"].why == "lab 99 was not run in this execution"
    both = claims.check(i98, others={"99": i99})
    assert both.verdicts() == {"shared": "not established", "own": "partly"}
    assert claims.check(i99, others={"98": i98}).verdicts() == {"shared": "not established"}
    with pytest.raises(ValueError):                          # a lab supplies exactly its parts
        claims.check(claims.Inputs("99", {"shared": claims.evidence("m", a=True)}), others={})
    with pytest.raises(ValueError):                          # ... and every claim the register gives it
        claims.check(claims.Inputs("98", {"shared": claims.evidence("m", a=True)}), others={})


def test_a_stored_notebook_older_than_the_register_supplies_no_part(two_labs, tmp_path):
    i98, i99 = two_labs
    stale = claims.Inputs("99", {"shared": claims.evidence("an older part", old_name=True)})
    for name, i in (("98_a.ipynb", i98), ("99_b.ipynb", stale)):
        (tmp_path / name).write_text(json.dumps(_stored(claims.check(i, others={}) if i is i98 else
                                                        claims.ClaimTable("99", [], i))))
    stored = claims.stored_inputs(tmp_path)
    assert stored["98"] == i98 and stored["99"].rows == {}
    assert claims.check(i98, others=stored).row("shared").parts["b"].state == "not measured"


def _stored(table: claims.ClaimTable) -> dict:
    """A notebook as papermill stores a cell that displayed ``table``."""
    out = {"output_type": "display_data", "metadata": {}, "data": json.loads(json.dumps(table._repr_mimebundle_()))}
    return {"cells": [{"cell_type": "code", "source": "claims.check(...)", "outputs": [out]}]}


def test_restamp_gives_every_notebook_the_same_row(two_labs):
    i98, i99 = two_labs
    nbs = [_stored(claims.check(i98, others={})), _stored(claims.check(i99, others={}))]
    rows = lambda nb: {r["key"]: r["verdict"] for r in claims._claim_output(nb)["data"][claims.MIME]["rows"]}
    assert rows(nbs[0])["shared"] != rows(nbs[1])["shared"]  # each executed before it saw the other's parts
    claims.restamp(nbs)
    assert rows(nbs[0])["shared"] == rows(nbs[1])["shared"] == "not established"
    assert claims.inputs_of(nbs[1]) == i99                   # the parts read back as data, not from prose
    assert "lab 99 (its notebook): ran b" in nbs[0]["cells"][0]["outputs"][0]["data"]["text/plain"]


def test_lab09_compression_is_judged_by_a_rank_sum_test_over_the_steps_of_one_run():
    """The register's link part of 'inefficient data transfer protocols': each hook's steps against plain
    DDP's in the same run (constructed points: the test, not a run)."""
    plain = tuple(300.0 + i for i in range(20))
    pts = [lab09.Point(100, "none", "ok", 300.0, 6.0, 0.1, plain),
           lab09.Point(100, "fp16", "ok", 150.0, 6.0, 0.1, tuple(150.0 + i for i in range(20))),
           lab09.Point(100, "bf16", "ok", 290.0, 6.0, 0.1, tuple(290.0 + i for i in range(20)))]
    text, p = lab09.compression_test(pts, 100)
    assert "fp16 2.00x" in text and "bf16" in text
    assert p <= 2 * 1e-6                                   # fp16 halves every step; doubled for the choice
    _, p_none = lab09.compression_test(pts[:1] + pts[2:], 100)
    assert p_none > 0.05                                   # 3% faster is not "more than 10%": not established
    assert lab09.compression_test(pts[:1], 100) == ("no hook timed", 1.0)
