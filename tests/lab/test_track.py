"""The build-the-engine track (`jaxlab check track`): the solutions of notebooks 04, 05, 06 and 11 assemble into an
engine that gives the golden tokens; untouched notebooks fail piece by piece; a wrong piece is named with its
notebook, whether its check or the engine finds it."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from conftest import load_solution, run_main
from test_checking import ROOT, solved_copy

from jaxlab.lab.exercises import track


def solved_folder(tmp_path: Path, bodies_only: bool = False) -> Path:
    """Notebooks 04, 05, 06 and 11 as a student who solved them saves them, in one folder."""
    for nn in track.NOTEBOOKS:
        solved_copy(nn, tmp_path, bodies_only)
    return tmp_path


def test_the_solutions_assemble_into_an_engine_that_gives_the_golden_tokens(tmp_path, capsys, load_once):
    """The solutions' bodies only, as written in the notebooks: every piece passes and, assembled, they serve the
    golden prompts with the golden tokens, the third request starting in a slot the second freed."""
    code, out, _ = run_main(capsys, ["check", "track", str(solved_folder(tmp_path, bodies_only=True))])
    assert code == 0 and "FAIL" not in out, out
    for p in track.PIECES:
        assert f"PASS  {p.number} {p.name}\n" in out
    assert out.count("PASS  request ") == len(track.MAX_NEW)
    assert "step 5: request 2 starts in slot 1" in out  # while request 0 is still decoding
    n = len(track.PIECES) + len(track.MAX_NEW)
    assert f"{n} of {n} pass: your engine gives the golden tokens" in out


def test_untouched_notebooks_fail_piece_by_piece(capsys):
    code, out, _ = run_main(capsys, ["check", "track", str(ROOT / "notebooks")])
    assert code == 1
    for p in track.PIECES:
        assert re.search(
            rf"FAIL  {p.number} {p.name}  -  .*not implemented yet \(fix it in {p.number}_\w+\.ipynb\)", out
        )
    assert "0 of 9 pass; the engine was not run" in out


def test_an_off_by_one_cache_write_is_named_with_its_notebook(tmp_path, capsys):
    folder = solved_folder(tmp_path)
    path = next(folder.glob("05_*.ipynb"))
    nb = json.loads(path.read_text(encoding="utf-8"))
    for c in nb["cells"]:
        c["source"] = "".join(c["source"]).replace("start[axis] = index\n", "start[axis] = index + 1\n")
    path.write_text(json.dumps(nb), encoding="utf-8")
    code, out, _ = run_main(capsys, ["check", "track", str(folder)])
    assert code == 1
    assert re.search(r"FAIL  05 my_cache_update  -  .*cache update: trial 0 .*\(fix it in 05_kv_cache\.ipynb\)", out)
    assert out.count("PASS  ") == len(track.PIECES) - 1 and "the engine was not run" in out


def test_missing_notebook_or_function_is_one_clear_line(tmp_path, capsys):
    code, _, err = run_main(capsys, ["check", "track", str(tmp_path)])
    assert code == 1 and "no 04_*.ipynb here or in notebooks/" in err
    folder = solved_folder(tmp_path)
    path = next(folder.glob("06_*.ipynb"))
    path.write_text(path.read_text(encoding="utf-8").replace("my_sample", "my_sampler"), encoding="utf-8")
    code, out, _ = run_main(capsys, ["check", "track", str(folder)])
    assert code == 1 and "FAIL  06 my_sample  -  no function my_sample in 06_batching_and_sampling.ipynb" in out


@pytest.fixture(scope="module")
def pieces():
    s04, s05, s06, s11 = (
        load_solution(n)
        for n in ("04_jit_and_generation", "05_kv_cache", "06_batching_and_sampling", "11_continuous_batching")
    )
    return {p.name: getattr({"04": s04, "05": s05, "06": s06, "11": s11}[p.number], p.name) for p in track.PIECES}


def tiny_requests():
    return [track.Request(i, list(range(3 + i, 12 + 2 * i)), n, []) for i, n in enumerate(track.MAX_NEW)]


def test_the_engine_blames_the_innermost_piece(pieces):
    """A cache write that fails only in the decode step (one new token) is blamed, not the decode step that called
    it; a scheduler that never admits is named instead of looping forever. On the tiny model: seconds."""
    from jaxlab.tools.program_export import tiny_params

    write = pieces["my_cache_update"]

    def fails_on_one_token(cache, new, index, axis):
        if new.ndim == 3 and new.shape[1] == 1:
            raise ValueError("one token")
        return write(cache, new, index, axis)

    with pytest.raises(track.PieceError, match="raised ValueError: one token") as e:
        track.generate({**pieces, "my_cache_update": fails_on_one_token}, tiny_params(), tiny_requests())
    assert e.value.piece == "my_cache_update"
    with pytest.raises(track.PieceError, match="would wait forever") as e:
        track.generate({**pieces, "my_admit": lambda *a: []}, tiny_params(), tiny_requests())
    assert e.value.piece == "my_admit"
