"""Execute notebooks in place (outputs stored for GitHub readers) and report how long each took.

    .venv/bin/python scripts/run_notebooks.py                 # every notebooks/NN_*.ipynb
    .venv/bin/python scripts/run_notebooks.py notebooks/03_flax_model.ipynb

Runs with the current environment's python kernel, from the notebooks folder, with the shared
persistent compilation cache; exits non-zero if a notebook fails or takes longer than --budget seconds.
"""

import argparse
import sys
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parent.parent


def run(path: Path, timeout: int) -> float:
    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(
        nb, timeout=timeout, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}}
    )
    t0 = time.perf_counter()
    client.execute()
    seconds = time.perf_counter() - t0
    nbformat.write(nb, path)
    return seconds


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("notebooks", nargs="*", type=Path)
    ap.add_argument("--timeout", type=int, default=300, help="per cell, seconds")
    ap.add_argument("--budget", type=float, default=60.0, help="per notebook, seconds")
    args = ap.parse_args()
    paths = args.notebooks or sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
    over = []
    for p in paths:
        s = run(p, args.timeout)
        print(f"{p.name:40s} {s:6.1f} s{'  OVER BUDGET' if s > args.budget else ''}", flush=True)
        if s > args.budget:
            over.append(p.name)
    if over:
        sys.exit(f"over the {args.budget:.0f} s budget: {', '.join(over)}")


if __name__ == "__main__":
    main()
