"""`jaxlab verdicts`: the verdicts and the run's host and date read back from saved notebooks, side by side."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from jaxlab.errors import JaxlabError
from jaxlab.lab import claims, verdicts
from jaxlab.lab.claims import Claim
from jaxlab.lab.notebook import setup, verdict


@pytest.fixture
def speedup(monkeypatch):
    monkeypatch.setitem(
        claims.CLAIMS,
        "t_fast",
        Claim("jit is 2-3x faster", "a test", "speed-up", at_least=2.0, condition="small ops", reason="r"),
    )
    monkeypatch.setitem(
        claims.CLAIMS, "t_small", Claim("int8 is smaller", "a test", "bytes ratio", at_least=3.5, reason="r")
    )
    return "t_fast"


def notebook(path: Path, outputs: list[str]) -> Path:
    cells = [{"cell_type": "markdown", "metadata": {}, "source": "# title"}]
    cells += [
        {"cell_type": "code", "metadata": {}, "execution_count": i, "source": "x", "outputs": []}
        if text is None
        else {
            "cell_type": "code",
            "metadata": {},
            "execution_count": i,
            "source": "x",
            "outputs": [{"output_type": "stream", "name": "stdout", "text": text.splitlines(keepends=True)}],
        }
        for i, text in enumerate(outputs, 1)
    ]
    path.write_text(json.dumps({"cells": cells, "metadata": {}, "nbformat": 4, "nbformat_minor": 5}))
    return path


def test_reads_each_verdict_where_its_numbers_come_from_and_the_run(speedup, tmp_path, capsys):
    info = setup(compile_cache=False)
    line = capsys.readouterr().out
    a = verdict(speedup, {"one matmul": 1.1, "decode step (30 layers)": 25.0}).text + "\n"
    b = verdict("t_small", 3.9, source="stored run: Intel(R) Xeon(R) Processor, 2 CPUs, 2026-12-01 22:52 UTC").text
    c = verdict(speedup, 1.2, because="one big matmul").text
    nb = notebook(tmp_path / "04_x.ipynb", [line, "a table\n" + a + "more\n", b, c])
    run = verdicts.read(nb)
    assert run.executed and run.run_on == info["run_on"] and "CPUs" in run.run_on
    got = [(f.key, f.word, f.met_by, f.source) for f in run.verdicts]
    assert got == [
        ("t_fast", "HOLDS ONLY WHEN", "decode step (30 layers)", "measured"),
        ("t_small", "HOLDS", "", "stored run: Intel(R) Xeon(R) Processor, 2 CPUs, 2026-12-01 22:52 UTC"),
        ("t_fast", "DOES NOT HOLD", "", "measured"),
    ]
    out = io.StringIO()
    tally = verdicts.report([run, verdicts.read(notebook(tmp_path / "05_y.ipynb", [None]))], out)
    text = out.getvalue()
    assert tally["HOLDS"] == 1 and tally["HOLDS ONLY WHEN"] == 1 and tally["DOES NOT HOLD"] == 1
    assert (
        "1 fed from stored runs (wholly or in part), 2 measured by the run alone" in text
        and "not run yet (no outputs): 05_y" in text
    )
    assert "met by: decode step (30 layers)" in text and f"run on {info['run_on']}" not in text  # the bare value
    assert info["run_on"] in text and "'t_fast' got different verdicts" in text


def test_the_command_finds_the_notebooks_and_says_what_to_do(tmp_path, monkeypatch, capsys):
    from jaxlab.cli import EXIT_USER_ERROR, main

    monkeypatch.chdir(tmp_path)
    with pytest.raises(JaxlabError, match="no NN_\\*.ipynb here"):
        verdicts.find_notebooks([])
    assert main(["verdicts", "missing.ipynb"]) == EXIT_USER_ERROR
    assert capsys.readouterr().err == (
        "jaxlab: error: no such notebook: missing.ipynb; give the paths of your saved notebooks\n"
    )
    (tmp_path / "notebooks").mkdir()
    notebook(tmp_path / "notebooks" / "01_a.ipynb", [None])
    assert main(["verdicts"]) == 1  # notebooks/ found; nothing run: says so, exits 1
    assert "no verdict found: run the notebooks" in capsys.readouterr().out
    (tmp_path / "notebooks" / "02_b.ipynb").write_text("{not json")
    with pytest.raises(JaxlabError, match="not a readable notebook"):
        verdicts.read(tmp_path / "notebooks" / "02_b.ipynb")


def test_the_lab_notebooks_stored_verdicts_are_all_read():
    """Every 'Claim:' printed in the shipped notebooks' outputs is parsed into a verdict (the parser and verdict()
    agree); tests/house/test_teaching.py grades them."""
    root = Path(__file__).resolve().parents[2] / "notebooks"
    for path in sorted(root.glob("[0-9][0-9]_*.ipynb")):
        run = verdicts.read(path)
        printed = sum(
            verdicts.output_text(o).count('Claim: "')
            for c in json.loads(path.read_text())["cells"]
            if c["cell_type"] == "code"
            for o in c.get("outputs", [])
        )
        assert len(run.verdicts) == printed, path.stem
