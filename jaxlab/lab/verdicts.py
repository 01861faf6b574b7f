"""`jaxlab verdicts [NOTEBOOK ...]`: every claim's verdict from the notebooks a student ran, side by side.

The workshop's wrap-up: which claims held, under which condition, and where each number came from. It reads the
saved notebooks (default: ``NN_*.ipynb`` in this folder, else in ``notebooks/``), finds each verdict that
:func:`jaxlab.lab.notebook.verdict` printed in their outputs, and the line :func:`jaxlab.lab.notebook.setup` printed
about the run (its host and date), so a notebook run on the student's machine today is told apart from the lab's
stored outputs. Nothing is re-run; a notebook with no outputs is listed as not run.
"""

from __future__ import annotations

import argparse
import re
from dataclasses import dataclass, field
from pathlib import Path

from jaxlab.errors import JaxlabError

# What verdict() prints: the claim's quote, what was measured, then the verdict line and its word. The line says
# "on this machine" (numbers measured by the run) or names the stored run it was fed from, in parentheses (a label
# may hold parentheses itself: "Intel(R) Xeon(R)").
VERDICT = re.compile(
    r'Claim: "(?P<quote>.*?)" \(.*?\n(?:.*\n)*?Verdict (?:on this machine|\((?P<source>.*?)\)): '
    r"(?P<rest>(?:HOLDS|DOES NOT HOLD|NOT MEASURABLE HERE)[^\n]*)"
)
RUN_ON = re.compile(r"\| run on (?P<run_on>[^\n]+)")


@dataclass
class Found:
    """One verdict in a notebook's outputs."""

    key: str | None  # the claim in jaxlab/lab/claims.py (None: a quote no claim has, e.g. an older notebook)
    quote: str
    word: str  # one of notebook.WORDS
    met_by: str  # the settings that met a HOLDS ONLY WHEN, as printed
    source: str  # "measured" or the stored run's label


@dataclass
class NotebookRun:
    path: Path
    executed: bool  # any code cell has outputs
    run_on: str | None  # setup()'s "run on <host>, <date>", when the run printed it
    verdicts: list[Found] = field(default_factory=list)


def output_text(o: dict) -> str:
    """The text of one notebook output (a stream, or an execute result's plain text)."""
    t = o.get("text", "")
    if not t and "data" in o:
        t = o["data"].get("text/plain", "")
    return t if isinstance(t, str) else "".join(t)


def read(path: Path) -> NotebookRun:
    """The verdicts, and the run's host and date, in one saved notebook's outputs."""
    from jaxlab.lab.checking import notebook_cells
    from jaxlab.lab.claims import CLAIMS
    from jaxlab.lab.notebook import WORDS

    cells = notebook_cells(path)
    by_quote = {c.quote: k for k, c in CLAIMS.items()}
    run = NotebookRun(Path(path), executed=False, run_on=None)
    for c in cells:
        if c.get("cell_type") != "code":
            continue
        for o in c.get("outputs", []):
            run.executed = True
            text = output_text(o)
            if run.run_on is None and (m := RUN_ON.search(text)):
                run.run_on = m["run_on"].strip()
            for m in VERDICT.finditer(text):
                rest = m["rest"]
                word = next(w for w in sorted(WORDS, key=len, reverse=True) if rest.startswith(w))
                met = re.search(r"\(met by: (.*)\)\s*$", rest)
                run.verdicts.append(
                    Found(by_quote.get(m["quote"]), m["quote"], word, met[1] if met else "", m["source"] or "measured")
                )
    return run


def find_notebooks(given: list[Path], where: Path | None = None) -> list[Path]:
    if given:
        missing = [str(p) for p in given if not Path(p).is_file()]
        if missing:
            raise JaxlabError(f"no such notebook: {', '.join(missing)}; give the paths of your saved notebooks")
        return [Path(p) for p in given]
    where = where or Path.cwd()
    for folder in (where, where / "notebooks"):
        found = sorted(folder.glob("[0-9][0-9]_*.ipynb"))
        if found:
            return found
    raise JaxlabError("no NN_*.ipynb here or in notebooks/: run this where your notebooks are, or give their paths")


def _cut(s: str, n: int) -> str:
    return s if len(s) <= n else s[: n - 3] + "..."


def report(runs: list[NotebookRun], out) -> dict:
    """Print the verdicts side by side, one claim a line (a claim judged in two notebooks: one line each), and the
    tally; return the tally."""
    from jaxlab.lab.notebook import WORDS

    ran = [r for r in runs if r.executed]
    out.write(f"Verdicts from {len(ran)} executed notebook(s) of {len(runs)}\n\n")
    for r in ran:
        out.write(f"  {r.path.stem:34s} {r.run_on or 'run on: not recorded (run before jaxlab printed it)'}\n")
    rows = [(r.path.stem[:2], f) for r in ran for f in r.verdicts]
    if rows:
        out.write(f"\n{'nb':3s} {'claim':60s} {'verdict':20s} numbers\n")
    for nb, f in rows:
        out.write(f"{nb:3s} {_cut(chr(34) + f.quote + chr(34), 60):60s} {f.word:20s} {_cut(f.source, 60)}\n")
        if f.met_by:
            out.write(f"{'':3s}   met by: {f.met_by}\n")
    tally = {w: sum(f.word == w for _, f in rows) for w in WORDS}
    stored = sum(f.source != "measured" for _, f in rows)
    out.write(
        f"\n{len(rows)} verdicts: "
        + ", ".join(f"{n} {w}" for w, n in tally.items() if n)
        + f"; {stored} fed from stored runs (wholly or in part), {len(rows) - stored} measured by the run alone\n"
    )
    split = {}
    for _, f in rows:
        split.setdefault(f.key or f.quote, set()).add(f.word)
    for k, words in split.items():
        if len(words) > 1:
            out.write(f"note: {k!r} got different verdicts in different notebooks: {', '.join(sorted(words))}\n")
    not_run = [r.path.stem for r in runs if not r.executed]
    if not_run:
        out.write(f"not run yet (no outputs): {', '.join(not_run)}\n")
    if not rows:
        out.write("no verdict found: run the notebooks (Run All), save them, and try again\n")
    return tally


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "notebooks",
        nargs="*",
        type=Path,
        help="saved notebooks (default: NN_*.ipynb in this folder, else in notebooks/)",
    )


def run(args, out) -> int:
    runs = [read(p) for p in find_notebooks(args.notebooks)]
    report(runs, out)
    return 0 if any(r.verdicts for r in runs) else 1
