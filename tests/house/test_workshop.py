"""docs/workshop.md's 3-hour path adds up and matches the notebooks: its minutes sum to 180 or under, and the sections
it skips are the ones each notebook marks *(3-hour path: skip)*, with both estimates at the notebook's top."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MARK = "*(3-hour path: skip)*"


def three_hour_rows() -> list[list[str]]:
    text = (ROOT / "docs" / "workshop.md").read_text(encoding="utf-8")
    part = text.split("### 3 hours", 1)[1].split("\n### ", 1)[0]
    rows = [
        [c.strip() for c in line.strip().strip("|").split("|")] for line in part.splitlines() if line.startswith("|")
    ]
    return [r for r in rows[2:]]  # past the header and its rule


def test_the_three_hour_path_fits_in_three_hours():
    rows = three_hour_rows()
    minutes = [int(r[1]) for r in rows]
    assert sum(minutes) <= 180, f"the 3-hour path takes {sum(minutes)} minutes"
    clock = 0
    for r, m in zip(rows, minutes):  # the start column follows from the minutes
        assert r[0] == f"{clock // 60}:{clock % 60:02d}", f"{r[2]}: starts at {r[0]}, the minutes before say otherwise"
        clock += m


def test_the_skipped_sections_are_marked_in_the_notebooks():
    for r in three_hour_rows():
        nn = r[2][:2]
        if not nn.isdigit():
            continue
        src = next((ROOT / "notebooks" / "src").glob(f"{nn}_*.py")).read_text(encoding="utf-8")
        marked = [h for h in re.findall(r"^# ## (.*)$", src, re.M) if MARK in h]
        listed = [s.strip() for s in r[5].split(";") if s.strip()]
        assert len(marked) == len(listed), f"{nn}: the guide skips {listed}, the notebook marks {marked}"
        for want, head in zip(listed, marked):
            words = re.sub(r"\(.*\)", "", want).strip()
            assert words.split()[0] in head, f"{nn}: the guide skips {want!r}, the notebook marks {head!r}"
        full = int(re.search(r"\*About (\d+) minutes", src)[1])
        short = re.search(r"\*About \d+ minutes \((\d+) on the 3-hour workshop path", src)
        assert short and int(short[1]) == int(r[1]) <= full, (
            f"{nn}: the notebook's top should say '*About {full} minutes ({r[1]} on the 3-hour workshop path...'"
        )
