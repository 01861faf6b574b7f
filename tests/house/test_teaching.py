"""What a learner gets from every notebook, kept by tests rather than by memory.

- Verdicts are computed: every ``verdict(key, measured)`` names a claim of ``jaxlab/lab/claims.py`` and passes a
  measured value, never a literal, a comparison or a bare bool (``verdict`` itself refuses a bool at run time).
- A verdict whose word can differ by host sits in an ``nbval-ignore-output`` cell; only ``steady`` claims (a count,
  an equality) may sit in a compared cell. The stored verdict words are the graded ones, and a claim quoted in
  two notebooks got the same word in both.
- At least two figures per notebook; an estimated time, learning goals, predict-then-run prompts, a summary,
  links, a quiz with hidden answers, answers for every exercise without a checker, and an experiment.
"""

from __future__ import annotations

import ast
import json
import re
from collections import defaultdict
from pathlib import Path

import pytest

from jaxlab.lab.claims import CLAIMS
from jaxlab.lab.notebook import WORDS
from jaxlab.lab.verdicts import read as read_verdicts

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
BY_QUOTE = {c.quote: k for k, c in CLAIMS.items()}


def cells(path):
    return json.loads(path.read_text(encoding="utf-8"))["cells"]


def source(cell) -> str:
    s = cell["source"]
    return s if isinstance(s, str) else "".join(s)


def tags(cell) -> set:
    return set(cell.get("metadata", {}).get("tags", []))


def calls(tree, name):
    return [n for n in ast.walk(tree) if isinstance(n, ast.Call) and getattr(n.func, "id", None) == name]


def unmeasured_value(node) -> str | None:
    """Why ``node`` is not a measured value, or None when it may be one."""
    if isinstance(node, ast.Constant):
        return f"the literal {node.value!r}"
    if isinstance(node, (ast.Compare, ast.BoolOp)) or (isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not)):
        return f"the comparison {ast.unparse(node)!r} (a bare bool)"
    if isinstance(node, ast.IfExp):
        return f"the choice {ast.unparse(node)!r}"
    if isinstance(node, ast.Dict):
        for v in node.values:
            why = unmeasured_value(v)
            if why:
                return why
    return None


def code_cells(path):
    for i, c in enumerate(cells(path)):
        if c["cell_type"] == "code":
            src = source(c)
            try:
                tree = ast.parse(src)
            except SyntaxError:  # a cell with IPython magics: no verdicts there
                continue
            yield i, c, tree


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_verdicts_are_computed_from_measurements(path):
    used = 0
    for i, cell, tree in code_cells(path):
        for call in calls(tree, "verdict") + calls(tree, "unmeasured"):
            name = call.func.id
            key = call.args[0] if call.args else None
            assert isinstance(key, ast.Constant) and key.value in CLAIMS, (
                f"{path.stem} cell {i}: {name}() must name a claim of jaxlab/lab/claims.py, got "
                f"{ast.unparse(key) if key else 'nothing'}"
            )
            if name == "verdict":
                assert len(call.args) >= 2, f"{path.stem} cell {i}: verdict({key.value!r}) without a measured value"
                why = unmeasured_value(call.args[1])
                assert why is None, f"{path.stem} cell {i}: verdict({key.value!r}) is given {why}, not a measurement"
            steady = CLAIMS[key.value].steady and name == "verdict"
            assert steady or "nbval-ignore-output" in tags(cell), (
                f"{path.stem} cell {i}: the verdict on {key.value!r} can differ by host; tag the cell "
                "nbval-ignore-output (or, if its measured value is a count or an equality, mark the claim steady)"
            )
            used += 1
        assert "Verdict on this machine" not in source(cell), f"{path.stem} cell {i}: a verdict printed by hand"
    assert used, f"{path.stem}: no verdict"


def from_a_stored_run(node, tainted: set) -> bool:
    """Whether ``node`` reads a stored run: a name or attribute that says ``stored`` (``stored("quant-cpu")``,
    ``finetuning.stored_run()``, ``batching.STORED_TRACE``) or a name assigned from one earlier in the notebook."""
    for n in ast.walk(node):
        name = n.id if isinstance(n, ast.Name) else n.attr if isinstance(n, ast.Attribute) else None
        if name is not None and ("stored" in name.lower() or name in tainted):
            return True
    return False


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_a_verdict_on_stored_numbers_says_where_they_come_from(path):
    """ "Verdict on this machine" is for numbers this run measured: a verdict fed from a stored run (wholly or in
    part) passes ``source=`` with the run's label (host and date), which the verdict line prints instead."""
    tainted: set = set()
    for i, _, tree in code_cells(path):
        for n in ast.walk(tree):  # assignments in source order are enough: a notebook's cells run top to bottom
            if isinstance(n, (ast.Assign, ast.AugAssign, ast.AnnAssign)) and n.value is not None:
                if from_a_stored_run(n.value, tainted):
                    targets = n.targets if isinstance(n, ast.Assign) else [n.target]
                    tainted |= {t.id for tg in targets for t in ast.walk(tg) if isinstance(t, ast.Name)}
        for call in calls(tree, "verdict"):
            fed = [a for a in call.args[1:2] + [k.value for k in call.keywords if k.arg == "measured"]]
            if any(from_a_stored_run(a, tainted) for a in fed):
                source = next((k.value for k in call.keywords if k.arg == "source"), None)
                assert source is not None and not isinstance(source, ast.Constant), (
                    f"{path.stem} cell {i}: verdict({ast.unparse(call.args[0])}) is fed from a stored run: pass "
                    "source=<the run's label> (host and date), not 'on this machine'"
                )


def stored_verdicts(path):
    """(claim key, word, quote) for each verdict in the notebook's stored outputs (the parser `jaxlab verdicts`
    uses)."""
    return [(f.key, f.word, f.quote) for f in read_verdicts(path).verdicts]


def test_stored_verdicts_are_graded_and_agree_across_notebooks():
    words = defaultdict(set)
    for path in NOTEBOOKS:
        found = stored_verdicts(path)
        assert found, f"{path.stem}: no verdict in the stored outputs (execute it: scripts/run_notebooks.py)"
        for key, word, quote in found:
            assert key, f"{path.stem}: a stored verdict on a claim not in claims.py: {quote[:60]!r}"
            assert word in WORDS, f"{path.stem}: the verdict on {key!r} is not one of {WORDS}"
            words[key].add((word, path.stem))
    for key, seen in words.items():
        assert len({w for w, _ in seen}) == 1, (
            f"the claim {key!r} got different verdicts: {sorted(seen)}; measure the settings that reconcile them "
            "(the claim's condition) in each notebook"
        )
    unused = set(CLAIMS) - set(words)
    assert not unused, f"claims no notebook judges: {sorted(unused)}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_no_return_value_echoed_under_a_cell(path):
    """check() and table() print what a reader should see and also return it (a bool, the table's text): left as a
    cell's last expression, Jupyter echoes the return value too ('True', or the table again as one quoted line)."""
    for i, c in enumerate(cells(path)):
        for o in c.get("outputs", []):
            if o.get("output_type") == "execute_result":
                text = "".join(o.get("data", {}).get("text/plain", ""))
                assert text not in ("True", "False") and not text.startswith(("'", '"')), (
                    f"{path.stem} cell {i}: the cell echoes {text[:40]!r}: assign its last call to _"
                )


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_at_least_two_figures(path):
    images = sum(
        1
        for c in cells(path)
        if c["cell_type"] == "code"
        for o in c.get("outputs", [])
        if "image/png" in o.get("data", {})
    )
    assert images >= 2, f"{path.stem}: {images} figure(s) in the stored outputs, need at least 2"


LINK = re.compile(r"https://(docs\.jax\.dev|jax\.readthedocs\.io|flax\.readthedocs\.io|arxiv\.org|[a-z.]+/)")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_every_notebook_teaches_the_same_way(path):
    md = [source(c) for c in cells(path) if c["cell_type"] == "markdown"]
    head, text = "\n".join(md[:2]), "\n".join(md)
    assert re.search(r"\*About \d+ minutes", head), f"{path.stem}: an estimated time ('*About N minutes*') at the top"
    assert "Learning goals" in head, f"{path.stem}: learning goals at the top"
    assert len(re.findall(r"Predict first", text)) >= 2, f"{path.stem}: 'Predict first' prompts before the measurements"
    assert re.search(r"^#+ .*Summary", text, re.M), f"{path.stem}: a Summary section"
    assert len(LINK.findall(text)) >= 3, f"{path.stem}: links to the JAX/Flax docs and the papers it cites"
    assert re.search(r"^#+ .*Quiz|\*\*Quiz\*\*", text, re.M), f"{path.stem}: quiz questions"
    assert text.count("<details>") >= 3, f"{path.stem}: quiz answers hidden in <details>"
    assert "experiment of your own" in text.lower(), (
        f"{path.stem}: one open-ended experiment ('An experiment of your own')"
    )
    for stale in ("the issue", "coming next", "is coming", "are coming"):
        assert stale not in text.lower(), f"{path.stem}: stale or internal text: {stale!r}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_every_exercise_has_a_checker_or_an_answer(path):
    cs = cells(path)
    start = next((i for i, c in enumerate(cs) if c["cell_type"] == "markdown" and "## Exercises" in source(c)), None)
    assert start is not None, f"{path.stem}: an Exercises section"
    exercise = re.compile(r"\*\*(?:Exercise )?\d+[.\s(]")
    for i in range(start, len(cs)):
        c = cs[i]
        if c["cell_type"] != "markdown":
            continue
        parts = exercise.split(source(c))[1:]
        for j, part in enumerate(parts):
            if "<details>" in part:
                continue
            nxt = next((source(x) for x in cs[i + 1 :] if x["cell_type"] == "code"), "") if j == len(parts) - 1 else ""
            assert re.search(r"\bnb\d\d\.check_", nxt), (
                f"{path.stem}: exercise {part[:50]!r} has neither a checker in the next code cell nor an answer in "
                "<details>"
            )
