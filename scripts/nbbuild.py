"""Build a notebook from "percent" text (the format Jupytext calls py:percent), with jaxlab's header;
or refresh the header of every notebook after the publishing setting or the version changed.

    python scripts/nbbuild.py notebooks/03_flax_model.ipynb < cells.py
    python scripts/nbbuild.py --headers            # every notebooks/NN_*.ipynb, in place

Cells are separated by lines starting with ``# %%``: ``# %% [markdown]`` for prose (each line after
it starts with ``# ``), ``# %% tags=["nbval-ignore-output"]`` for tagged code cells. The header (Colab
badge, title, learning goals, and the guarded Colab set-up cell) is added from the first markdown
cell, which must start with ``# Title``. The badge and the set-up cell come from ``[tool.jaxlab]
repository`` and the version in pyproject.toml (:mod:`jaxlab.colab`; README, "Publish your copy").
Execute afterwards with scripts/run_notebooks.py (``--headers`` changes no executed output: the set-up
cell does nothing outside Colab).
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from jaxlab import colab  # noqa: E402

SETUP_TAG = "nbval-ignore-output"  # the set-up cell prints install progress on Colab, nothing elsewhere
BADGE = re.compile(r"^\[!\[Open In Colab\]\([^)]*\)\]\([^)]*\)\n\n")


def parse(text: str):
    cells = []
    for block in re.split(r"^# %%", text, flags=re.M)[1:]:
        head, _, body = block.partition("\n")
        head = head.strip()
        tags = []
        m = re.search(r"tags=(\[.*?\])", head)
        if m:
            tags = json.loads(m.group(1))
        body = body.strip("\n")
        if head.startswith("[markdown]"):
            lines = [l[2:] if l.startswith("# ") else l.lstrip("#") for l in body.splitlines()]
            cell = nbformat.v4.new_markdown_cell("\n".join(lines))
        else:
            cell = nbformat.v4.new_code_cell(body)
        if tags:
            cell.metadata["tags"] = tags
        cells.append(cell)
    return cells


def header(name: str, settings: dict | None = None) -> tuple[str, str]:
    """(badge line + blank line, set-up cell source) for notebook file ``name``."""
    settings = settings or colab.project_settings(ROOT)
    return colab.badge(settings["repository"], name) + "\n\n", colab.setup_cell(settings)


def build(path: Path, text: str) -> None:
    cells = parse(text)
    badge, setup = header(Path(path).name)
    assert cells and cells[0].cell_type == "markdown" and cells[0].source.startswith("# "), "first cell: # Title"
    cells[0].source = badge + cells[0].source
    cells.insert(1, nbformat.v4.new_code_cell(setup, metadata={"tags": [SETUP_TAG]}))
    nb = nbformat.v4.new_notebook(cells=cells)
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.metadata["language_info"] = {"name": "python"}
    nbformat.write(nb, path)


def refresh_header(path: Path, settings: dict | None = None) -> bool:
    """Rewrite the badge and the set-up cell of an existing notebook; -> whether anything changed."""
    nb = nbformat.read(path, as_version=4)
    badge, setup = header(path.name, settings)
    title, cell = nb.cells[0], nb.cells[1]
    assert title.cell_type == "markdown" and BADGE.match(title.source), f"{path.name}: first cell is not the badge"
    assert cell.cell_type == "code" and "google.colab" in cell.source, f"{path.name}: second cell is not the set-up"
    new_title = BADGE.sub(lambda _: badge, title.source, count=1)
    tags = cell.metadata.get("tags", [])
    if (new_title, setup) == (title.source, cell.source) and SETUP_TAG in tags:
        return False
    title.source, cell.source = new_title, setup
    cell.metadata["tags"] = sorted(set(tags) | {SETUP_TAG})
    nbformat.write(nb, path)
    return True


if __name__ == "__main__":
    if sys.argv[1:] == ["--headers"]:
        for p in sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb")):
            print(f"{p.name}: {'updated' if refresh_header(p) else 'up to date'}")
    else:
        build(Path(sys.argv[1]), sys.stdin.read())
