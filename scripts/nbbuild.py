"""Notebooks from text: each ``notebooks/NN_name.ipynb`` is built from ``notebooks/src/NN_name.py``, its
committed source in the py:percent format (jupytext), plus jaxlab's header.

    python scripts/nbbuild.py notebooks/src/03_flax_model.py   # build notebooks/03_flax_model.ipynb from it
    python scripts/run_notebooks.py notebooks/03_flax_model.ipynb  # then execute it (outputs are stored)
    python scripts/nbbuild.py --sources    # write every source from its notebook (after editing an .ipynb)
    python scripts/nbbuild.py --sources notebooks/05_kv_cache.ipynb  # only these notebooks' sources
    python scripts/nbbuild.py --headers    # rewrite every notebook's badge and set-up cell, in place

A source holds the notebook's cells as text: ``# %% [markdown]`` cells with ``# ``-prefixed prose,
``# %%`` code cells, and ``# %% tags=["nbval-ignore-output"]`` for tagged ones. It starts with the
title cell (``# # NN · Title``) and has no header: the Colab badge (put before the title) and the guarded
Colab set-up cell (the second cell) are made from ``[tool.jaxlab] repository`` and the version in
pyproject.toml (:mod:`jaxlab.colab`; README, "Publish your copy"). tests/house/test_notebooks.py fails when a
source and its notebook differ. ``--headers`` changes no executed output: the set-up cell does nothing
outside Colab.
"""

from __future__ import annotations

import copy
import re
import sys
from pathlib import Path

import jupytext
import nbformat

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = ROOT / "notebooks"
SOURCES = NOTEBOOKS / "src"
sys.path.insert(0, str(ROOT))
from jaxlab import colab  # noqa: E402

SETUP_TAG = "nbval-ignore-output"  # the set-up cell prints install progress on Colab, nothing elsewhere
BADGE = re.compile(r"^\[!\[Open In Colab\]\([^)]*\)\]\([^)]*\)\n\n")
FORMAT = "py:percent"
# only the cells' tags travel through the text; no notebook-level metadata
TEXT_METADATA = {"jupytext": {"notebook_metadata_filter": "-all", "cell_metadata_filter": "tags"}}


def notebooks() -> list[Path]:
    return sorted(NOTEBOOKS.glob("[0-9][0-9]_*.ipynb"))


def source_path(notebook: Path) -> Path:
    return SOURCES / f"{Path(notebook).stem}.py"


def header(name: str, settings: dict | None = None) -> tuple[str, str]:
    """(badge line + blank line, set-up cell source) for notebook file ``name``."""
    settings = settings or colab.project_settings(ROOT)
    return colab.badge(settings["repository"], name) + "\n\n", colab.setup_cell(settings)


def header_cells(nb: nbformat.NotebookNode, name: str = "notebook") -> tuple:
    """(title cell with the badge, Colab set-up cell): the first two cells of a built notebook."""
    title, setup = nb.cells[0], nb.cells[1]
    assert title.cell_type == "markdown" and BADGE.match(title.source), f"{name}: first cell is not the badge"
    assert setup.cell_type == "code" and "google.colab" in setup.source, f"{name}: second cell is not the set-up"
    return title, setup


def source_text(nb: nbformat.NotebookNode) -> str:
    """A notebook's source: its cells without the header, outputs and metadata other than tags."""
    nb = copy.deepcopy(nb)
    title, _ = header_cells(nb)
    title.source = BADGE.sub("", title.source, count=1)
    del nb.cells[1]
    for cell in nb.cells:
        cell.metadata = {"tags": cell.metadata["tags"]} if cell.metadata.get("tags") else {}
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    nb.metadata = copy.deepcopy(TEXT_METADATA)
    return jupytext.writes(nb, fmt=FORMAT)


def build(source: Path, path: Path | None = None) -> Path:
    """notebooks/src/NN_name.py -> notebooks/NN_name.ipynb, or ``path`` (header added, not executed)."""
    source = Path(source)
    nb = jupytext.read(source, fmt=FORMAT)
    cells = nb.cells
    assert cells and cells[0].cell_type == "markdown" and cells[0].source.startswith("# "), "first cell: # Title"
    path = Path(path) if path is not None else NOTEBOOKS / f"{source.stem}.ipynb"
    badge, setup = header(f"{source.stem}.ipynb")
    cells[0].source = badge + cells[0].source
    cells.insert(1, nbformat.v4.new_code_cell(setup, metadata={"tags": [SETUP_TAG]}))
    out = nbformat.v4.new_notebook(cells=[_clean(c) for c in cells])
    out.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    out.metadata["language_info"] = {"name": "python"}
    nbformat.write(out, path)
    return path


def _clean(cell):
    """A fresh nbformat cell (with an id) carrying the text cell's source and tags."""
    tags = cell.metadata.get("tags")
    new = (nbformat.v4.new_markdown_cell if cell.cell_type == "markdown" else nbformat.v4.new_code_cell)(cell.source)
    if tags:
        new.metadata["tags"] = list(tags)
    return new


def refresh_header(path: Path, settings: dict | None = None) -> bool:
    """Rewrite the badge and the set-up cell of an existing notebook; -> whether anything changed."""
    nb = nbformat.read(path, as_version=4)
    badge, setup = header(path.name, settings)
    title, cell = header_cells(nb, path.name)
    new_title = BADGE.sub(lambda _: badge, title.source, count=1)
    tags = cell.metadata.get("tags", [])
    if (new_title, setup) == (title.source, cell.source) and SETUP_TAG in tags:
        return False
    title.source, cell.source = new_title, setup
    cell.metadata["tags"] = sorted(set(tags) | {SETUP_TAG})
    nbformat.write(nb, path)
    return True


def main(argv: list[str]) -> int:
    if argv == ["--headers"]:
        for p in notebooks():
            print(f"{p.name}: {'updated' if refresh_header(p) else 'up to date'}")
    elif argv[:1] == ["--sources"]:
        # A source edited after its notebook was built holds work the notebook does not: never written over
        # (build it first, or pass --force to take the notebook's cells).
        force = "--force" in argv
        chosen = [Path(a).resolve() for a in argv[1:] if a != "--force"]
        SOURCES.mkdir(exist_ok=True)
        kept = []
        for p in chosen or notebooks():
            text = source_text(nbformat.read(p, as_version=4))
            target = source_path(p)
            changed = not target.exists() or target.read_text() != text
            if changed and not force and target.exists() and target.stat().st_mtime > p.stat().st_mtime:
                kept.append(target)
                print(f"{target.relative_to(ROOT)}: KEPT: edited after {p.name} was built (build it, or --force)")
                continue
            if changed:
                target.write_text(text)
            print(f"{target.relative_to(ROOT)}: {'written' if changed else 'up to date'}")
        if kept:
            return 1
    elif len(argv) == 1 and argv[0].endswith(".py"):
        print(f"built {build(Path(argv[0])).relative_to(ROOT)}; execute it with scripts/run_notebooks.py")
    else:
        print(__doc__, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
