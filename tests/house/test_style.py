"""The code's style is checked, not remembered: ruff's lint rules and its formatter (pinned; configured in
pyproject.toml) over the package, the tests, the scripts and the benchmark scripts."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PATHS = ["jaxlab", "tests", "scripts", "benchmarks"]


@pytest.mark.parametrize("command", [["check"], ["format", "--check"]], ids=["lint", "format"])
def test_ruff(command):
    proc = subprocess.run([sys.executable, "-m", "ruff", *command, *PATHS], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, (
        f"ruff {' '.join(command)} found problems (fix with `.venv/bin/ruff check --fix` / `.venv/bin/ruff format`):\n"
        f"{proc.stdout[-4000:]}{proc.stderr[-1000:]}"
    )
