"""Every notebook's accelerator branch, run on this CPU (``make test-proxy``): the accelerator proxy.

With ``JAXLAB_ACCELERATOR_PROXY=tpu`` a notebook's kernel takes a TPU's numerics and criteria
(:func:`jaxlab.engine.model.proxy_backend`): ``jaxlab.load()`` gives bfloat16 weights, the golden and agreement
checks use the accelerator's criteria, and what a notebook says about the backend follows. XLA:CPU still computes,
so timings are the CPU's. Each notebook is executed whole (its stored outputs, the CPU run, are neither compared nor
written); a cell that raises, or a check that prints ``FAIL:``, fails the test with the cell and the line. The
Exercises section is left out of the second rule: its checks print FAIL until a student writes the answer (the
exercises' solutions pass under every backend: ``tests/lab``).
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

#: Notebook 16 compiles for a TPU with libtpu whatever the backend, and its CPU section sets float32 itself: no line
#: of it follows the numerics backend, so the proxy would run it exactly as `make test` does (82 s of the budget)
SAME_UNDER_THE_PROXY = {"16_tpu_from_cpu"}
#: Seconds each took under the proxy in CI (2-core AMD EPYC, 2026-12-05): the longest go out first, so neither of
#: `make test-proxy`'s two workers waits long for the other at the end
SECONDS = {"10": 143, "08": 106, "07": 84, "06": 75, "14": 71, "09": 61, "15": 61, "11": 50, "04": 49, "03": 39}
NOTEBOOKS = sorted(
    (
        p
        for p in (Path(__file__).resolve().parents[2] / "notebooks").glob("[0-9][0-9]_*.ipynb")
        if p.stem not in SAME_UNDER_THE_PROXY
    ),
    key=lambda p: (-SECONDS.get(p.stem[:2], 30), p.stem),
)

pytestmark = pytest.mark.proxy


def _text(output) -> str:
    if output.get("output_type") == "stream":
        return output.get("text", "")
    data = output.get("data", {})
    return data.get("text/plain", "") if isinstance(data.get("text/plain", ""), str) else "".join(data["text/plain"])


def test_the_notebooks_left_out_do_not_follow_the_numerics_backend():
    import nbformat

    for stem in SAME_UNDER_THE_PROXY:
        path = Path(__file__).resolve().parents[2] / "notebooks" / f"{stem}.ipynb"
        code = "\n".join(c.source for c in nbformat.read(path, as_version=4).cells if c.cell_type == "code")
        for word in ("jaxlab.load(", "numerics_backend", "policy", "golden_criteria", "agreement_rtol"):
            assert word not in code, f"{stem} uses {word}: run it under the proxy too"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_runs_green_under_the_tpu_proxy(path, monkeypatch):
    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError

    monkeypatch.setenv("JAXLAB_ACCELERATOR_PROXY", "tpu")
    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}})
    t0 = time.perf_counter()
    try:
        client.execute()
    except CellExecutionError as e:
        pytest.fail(f"{path.name} raised under the TPU proxy:\n{str(e)[-3000:]}", pytrace=False)
    seconds = time.perf_counter() - t0
    from jaxlab.lab.checking import SECTION

    failed, proxied, exercises = [], False, False
    for i, cell in enumerate(nb.cells):
        exercises |= cell.cell_type == "markdown" and SECTION in cell.source
        if exercises:
            continue
        for out in cell.get("outputs", []):
            for line in _text(out).splitlines():
                failed += [f"cell {i}: {line}"] if line.startswith("FAIL") else []
                proxied |= line.startswith("accelerator proxy (JAXLAB_ACCELERATOR_PROXY=tpu)")
    print(f"{path.name}: {seconds:.1f} s under the TPU proxy")
    assert not failed, f"{path.name} under the TPU proxy:\n" + "\n".join(failed)
    if any("setup(" in c.source for c in nb.cells if c.cell_type == "code"):
        assert proxied, f"{path.name} ran setup() but did not report the proxy: the variable did not reach the kernel"
