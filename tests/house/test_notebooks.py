"""The notebooks' shape: badge and Colab set-up first, stored outputs, no stray errors, enough checked
cells that no notebook passes nbval by ignoring everything; and JupyterLab really serves them.

Executing them is nbval's job (`make test` runs `pytest --nbval notebooks`)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = ROOT / "notebooks"
sys.path.insert(0, str(ROOT / "scripts"))
import nbbuild  # noqa: E402

EXPECTED = [
    "00_setup",
    "01_jax_essentials",
    "02_tokenization",
    "03_flax_model",
    "04_jit_and_generation",
    "05_kv_cache",
    "06_batching_and_sampling",
    "07_profiling_and_compilation",
    "08_parallelism",
    "09_quantization",
    "10_speculative_decoding",
    "16_tpu_from_cpu",
    "17_structured_output",
    "18_bringing_up_a_model",
]
IGNORE_TAGS = {"nbval-ignore-output", "nbval-skip"}


def notebooks():
    return sorted(NOTEBOOKS.glob("[0-9][0-9]_*.ipynb"))


def tags(cell):
    return set(cell.get("metadata", {}).get("tags", []))


def checked(cell):
    """A code cell whose stored output nbval compares."""
    src = cell.source
    return (
        cell.cell_type == "code"
        and not (tags(cell) & IGNORE_TAGS)
        and "NBVAL_IGNORE_OUTPUT" not in src
        and "NBVAL_SKIP" not in src
        and "raises-exception" not in tags(cell)
    )


def test_expected_notebooks_exist():
    names = [p.stem for p in notebooks()]
    for n in EXPECTED:
        assert n in names, f"notebooks/{n}.ipynb is missing"


@pytest.mark.parametrize("path", notebooks(), ids=lambda p: p.stem)
def test_notebook_structure(path):
    nb = nbformat.read(path, as_version=4)
    cells = nb.cells
    assert cells[0].cell_type == "markdown" and "colab-badge.svg" in cells[0].source, "first cell: the Colab badge"
    assert "Learning goals" in cells[0].source or "Learning goals" in cells[1].source, "learning goals at the top"
    setup = next(c for c in cells if c.cell_type == "code")
    assert "google.colab" in setup.source, "first code cell: the guarded Colab install"
    assert '"colab.py"' in setup.source and "torch==" not in setup.source and "install torch" not in setup.source, (
        "the Colab cell runs jaxlab/colab.py (pinned jax/flax) and leaves Colab's torch alone (tests/test_colab.py)"
    )
    code = [c for c in cells if c.cell_type == "code"]
    for c in code:
        assert c.execution_count is not None or not c.source.strip(), f"cell not executed:\n{c.source[:200]}"
        errors = [o for o in c.get("outputs", []) if o.output_type == "error"]
        if errors:
            assert "raises-exception" in tags(c), (
                f"error output in a cell not tagged raises-exception:\n{c.source[:200]}"
            )
    with_output = [c for c in code if checked(c) and c.get("outputs")]
    assert len(with_output) >= 5, f"only {len(with_output)} output-checked cells"
    text = "".join(o.get("text", "") for c in with_output for o in c.outputs if o.output_type == "stream")
    assert "Verdict" in text or "PASS" in text, "no verdict or check among the checked outputs"
    assert any(c.cell_type == "markdown" and "Exercises" in c.source for c in cells), "an Exercises section"


@pytest.mark.parametrize("path", notebooks(), ids=lambda p: p.stem)
def test_notebook_and_its_text_source_agree(path):
    """Each notebook has a committed py:percent source (notebooks/src/) that holds exactly its cells."""
    src = nbbuild.source_path(path)
    assert src.exists(), f"{src.relative_to(ROOT)} is missing: run python scripts/nbbuild.py --sources"
    assert nbbuild.source_text(nbformat.read(path, as_version=4)) == src.read_text(), (
        f"{path.name} and {src.relative_to(ROOT)} differ: build the notebook from its source "
        f"(python scripts/nbbuild.py {src.relative_to(ROOT)}, then scripts/run_notebooks.py), or after editing "
        "the .ipynb write the source again (python scripts/nbbuild.py --sources)"
    )


def test_building_from_the_source_gives_the_notebook_cells(tmp_path):
    for path in notebooks():
        built = nbformat.read(nbbuild.build(nbbuild.source_path(path), tmp_path / path.name), as_version=4)
        have = nbformat.read(path, as_version=4)

        def key(nb):
            return [(c.cell_type, c.source, c.metadata.get("tags", [])) for c in nb.cells]

        assert key(built) == key(have), f"{path.name}: building its source does not give its cells"
    with pytest.raises(AssertionError, match="Title"):
        (tmp_path / "bad.py").write_text("# %%\nprint(1)\n")
        nbbuild.build(tmp_path / "bad.py", tmp_path / "bad.ipynb")


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def hide_solutions_option() -> list[str]:
    """The option `make lab` gives JupyterLab so that the solutions are not in a student's file tree."""
    import re
    import shlex

    m = re.search(r"^HIDE := \$\(if \$\(SOLUTIONS\),,(.*)\)$", (ROOT / "Makefile").read_text(), re.M)
    assert m, "the Makefile's HIDE line (the lab's option that hides notebooks/solutions) is missing"
    return shlex.split(m.group(1))


def test_jupyterlab_serves_every_notebook(tmp_path):
    """`make lab`'s JupyterLab, with its options: every notebook in the tree, the solutions not."""
    port, token = _free_port(), "jaxlab-test-token"
    env = dict(os.environ, JUPYTER_RUNTIME_DIR=str(tmp_path / "rt"), JUPYTER_CONFIG_DIR=str(tmp_path / "cfg"))
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "jupyterlab",
            "--no-browser",
            f"--port={port}",
            "--ServerApp.ip=127.0.0.1",
            f"--IdentityProvider.token={token}",
            f"--ServerApp.root_dir={NOTEBOOKS}",
            "--ServerApp.open_browser=False",
            *hide_solutions_option(),
        ]
        + (["--allow-root"] if os.geteuid() == 0 else []),  # CI runs as root; Jupyter refuses root without it
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=env,
        start_new_session=True,
    )
    try:
        url = f"http://127.0.0.1:{port}/api/contents?token={token}"
        deadline = time.time() + 60
        while True:
            try:
                listing = json.load(urllib.request.urlopen(url, timeout=5))
                break
            except OSError:
                if time.time() > deadline or proc.poll() is not None:
                    raise AssertionError("JupyterLab did not start within 60 s")
                time.sleep(0.5)
        served = {item["name"] for item in listing["content"]}
        for p in notebooks():
            assert p.name in served
        assert (NOTEBOOKS / "solutions").is_dir() and "solutions" not in served, "solutions in the student's tree"
        lab = urllib.request.urlopen(f"http://127.0.0.1:{port}/lab?token={token}", timeout=10)
        assert lab.status == 200
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=20)
