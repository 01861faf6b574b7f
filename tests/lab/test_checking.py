"""`jaxlab check NN NOTEBOOK` runs a saved notebook's exercises through their checks: an untouched copy fails,
a copy with the solutions passes, and bad input is one clear line."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest
from conftest import SOLUTIONS, one_clean_line, run_main

ROOT = Path(__file__).resolve().parents[2]


def notebook(nn: str) -> Path:
    return next((ROOT / "notebooks").glob(f"{nn}_*.ipynb"))


def stub(node) -> bool:
    """``def f(...): raise NotImplementedError`` (the exercise as handed out)."""
    body = [b for b in node.body if not (isinstance(b, ast.Expr) and isinstance(b.value, ast.Constant))]
    return len(body) == 1 and isinstance(body[0], ast.Raise)


def solved_copy(nn: str, tmp_path: Path, bodies_only: bool = False) -> Path:
    """The notebook as a student who solved every exercise would save it: the solutions' code in place of the
    stubs (the solution file is pasted into the first exercise cell). ``bodies_only``: without the solution file's
    own top-level imports, as a student writes an answer in a notebook whose cells above imported ``jnp`` & co."""
    path = notebook(nn)
    nb = json.loads(path.read_text(encoding="utf-8"))
    solution = (SOLUTIONS / f"{path.stem}.py").read_text(encoding="utf-8")
    answers = {
        t.id
        for n in ast.parse(solution).body
        if isinstance(n, ast.Assign)
        for t in n.targets
        if isinstance(t, ast.Name)
    }

    def answered(node) -> bool:  # `my_answer = None` in the notebook, where the solution gives the value
        return isinstance(node, ast.Assign) and all(isinstance(t, ast.Name) and t.id in answers for t in node.targets)

    if bodies_only:
        tree = ast.parse(solution)
        tree.body = [n for n in tree.body if not isinstance(n, (ast.Import, ast.ImportFrom))]
        solution = ast.unparse(tree)
    start = next(
        i for i, c in enumerate(nb["cells"]) if c["cell_type"] == "markdown" and "## Exercises" in "".join(c["source"])
    )
    first = True
    for c in nb["cells"][start:]:
        if c["cell_type"] != "code":
            continue
        tree = ast.parse("".join(c["source"]))
        tree.body = [n for n in tree.body if not (isinstance(n, ast.FunctionDef) and stub(n)) and not answered(n)]
        c["source"] = (solution + "\n" if first else "") + ast.unparse(tree)
        first = False
    out = tmp_path / path.name
    out.write_text(json.dumps(nb), encoding="utf-8")
    return out


WITH_CHECKS = sorted(p.stem[:2] for p in (ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))


@pytest.mark.parametrize("nn", WITH_CHECKS)
def test_answers_written_as_in_the_notebook_pass(nn, tmp_path, capsys):
    """The solutions' bodies only, relying on the notebook's own imports (jnp, np, jax, jaxlab ...), pass."""
    code, out, _ = run_main(capsys, ["check", nn, str(solved_copy(nn, tmp_path, bodies_only=True))])
    assert code == 0 and "FAIL" not in out, out


@pytest.mark.parametrize("nn", ["04", "11"])
def test_untouched_copy_fails_and_solved_copy_passes(nn, tmp_path, capsys):
    code, out, _ = run_main(capsys, ["check", nn, str(notebook(nn))])
    assert code == 1 and "not implemented yet" in out and "\n0 of " in out, out
    code, out, _ = run_main(capsys, ["check", nn, str(solved_copy(nn, tmp_path))])
    assert code == 0 and "FAIL" not in out, out
    n = out.count("PASS ")
    assert n >= 2 and f"{n} of {n} pass" in out


def test_a_cell_that_raises_is_one_line_and_the_rest_still_runs(tmp_path, capsys):
    path = solved_copy("11", tmp_path)
    nb = json.loads(path.read_text(encoding="utf-8"))
    code_cells = [c for c in nb["cells"] if c["cell_type"] == "code"]
    code_cells[-1]["source"] = "1 / 0\n" + code_cells[-1]["source"]
    path.write_text(json.dumps(nb), encoding="utf-8")
    code, out, _ = run_main(capsys, ["check", "11", str(path)])
    assert code == 1 and "raised ZeroDivisionError: division by zero" in out
    assert out.count("PASS ") >= 2  # the cells before it were checked


@pytest.mark.parametrize(
    "args, says",
    [
        (["check", "4x"], "not a notebook number"),
        (["check", "04", "/nonexistent/04.ipynb"], "no such file"),
        (["check", "13", str(ROOT / "README.md")], "not a readable notebook"),
    ],
)
def test_bad_input_is_one_clear_line(args, says, capsys):
    code, _, err = run_main(capsys, args)
    assert code == 1 and says in one_clean_line(err)


def test_finds_the_notebook_by_number(tmp_path, monkeypatch):
    from jaxlab.errors import JaxlabError
    from jaxlab.lab.checking import find_notebook

    (tmp_path / "notebooks").mkdir()
    (tmp_path / "notebooks" / "04_x.ipynb").write_text("{}")
    assert find_notebook("4", where=tmp_path).name == "04_x.ipynb"
    (tmp_path / "04_mine.ipynb").write_text("{}")
    assert find_notebook("04", where=tmp_path).name == "04_mine.ipynb"
    with pytest.raises(JaxlabError, match="no 05_"):
        find_notebook("05", where=tmp_path)
