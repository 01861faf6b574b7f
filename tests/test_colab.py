"""Colab as a runtime: the set-up cell, the Colab constraints, the wheel's data, and a simulated Colab run.

The simulation (:func:`test_colab_simulation`) builds a fresh venv holding Colab's preinstalled versions
(``tests/colab/runtime.txt``, with where they come from; like Colab's image, they are installed once, into a
folder beside the test environment, and each run starts from a hard-linked copy: pip replaces files, it never
writes into them), a stand-in ``google.colab`` module, and a bare
git repository of this working tree tagged ``v<version>`` that the set-up cell's GitHub URL is redirected
to (``url.<bare>.insteadOf`` through ``GIT_CONFIG_GLOBAL``). Then nbval executes notebook 00 in that
venv's kernel, strictly, set-up cell first: the cell must upgrade jax and flax (Colab's are too old for
the model: the notebook fails without it), keep Colab's numpy, and install a jaxlab whose wheel carries
the data files (nothing points JAXLAB_DATA at a clone). Then, in the same venv, the cell's clone-and-version
step runs again with the tag deleted: a repository published as it is, whose default branch the cell installs.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import nbformat
import pytest
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet

from jaxlab import colab

ROOT = Path(__file__).resolve().parent.parent
RUNTIME = Path(__file__).resolve().parent / "colab" / "runtime.txt"
SETTINGS = colab.project_settings(ROOT)
sys.path.insert(0, str(ROOT / "scripts"))
import nbbuild  # noqa: E402


def constraints() -> dict[str, SpecifierSet]:
    out = {}
    for line in (ROOT / colab.CONSTRAINTS).read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            req = Requirement(line)
            out[colab.requirement_name(req.name)] = req.specifier
    return out


def colab_versions() -> dict[str, str]:
    return colab.pins(RUNTIME.read_text().splitlines())


# ---------------------------------------------------------------------------------------------------
# Fast checks of the pieces
# ---------------------------------------------------------------------------------------------------


def test_constraints_pin_jax_flax_exactly_and_keep_colabs_versions():
    ours = colab.pins(SETTINGS["dependencies"] + SETTINGS["optional"]["lab"] + SETTINGS["optional"]["serve"])
    cons, theirs = constraints(), colab_versions()
    needed = {colab.requirement_name(n.split("[")[0]) for n in colab.colab_packages(SETTINGS, "cpu")}
    assert needed == set(cons), f"constraints-colab.txt must name exactly what the cell installs: {needed ^ set(cons)}"
    for name in colab.PINNED:
        assert str(cons[name]) == f"=={ours[name]}", f"{name} must be pinned to pyproject's {ours[name]} on Colab"
        assert theirs[name] not in cons[name], (
            f"Colab's {name} {theirs[name]} is older than ours: the cell must upgrade it"
        )
    for name, spec in cons.items():
        assert ours[name] in spec, f"{name}: the range {spec} excludes jaxlab's tested pin {ours[name]}"
        if name in theirs and name not in colab.PINNED:
            assert theirs[name] in spec, f"{name}: the range {spec} would replace Colab's {theirs[name]}"


def test_colab_packages_match_the_runtime():
    for runtime, jax_spec in (("tpu", "jax[tpu]"), ("gpu", "jax[cuda12]"), ("cpu", "jax")):
        names = colab.colab_packages(SETTINGS, runtime)
        assert names[0] == jax_spec and {"jaxlib", "flax", "numpy", "matplotlib", "ipywidgets"} <= set(names)
        assert not {"jupyterlab", "ipykernel", "torch", "transformers"} & set(names)


def test_detect_runtime_override_and_error():
    assert colab.detect_runtime({"JAXLAB_ACCELERATOR": "TPU"}) == "tpu"
    assert colab.detect_runtime({"JAXLAB_ACCELERATOR": "cpu"}) == "cpu"
    with pytest.raises(colab.SetupError, match="not one of tpu, gpu, cpu"):
        colab.detect_runtime({"JAXLAB_ACCELERATOR": "cuda"})
    # this machine: no TPU device, no nvidia-smi; libtpu is installed (make test: `jaxlab compile`), not a TPU
    import importlib.util

    assert importlib.util.find_spec("libtpu") is not None, "make test installs libtpu (jax[tpu] at the pin)"
    assert colab.detect_runtime({}) == "cpu"
    assert colab.detect_runtime({"TPU_ACCELERATOR_TYPE": "v5litepod-1"}) == "tpu"


def test_every_notebook_header_is_made_from_the_publishing_setting(tmp_path):
    for path in sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb")):
        copy = tmp_path / path.name
        shutil.copy(path, copy)
        assert not nbbuild.refresh_header(copy), (
            f"{path.name}: header is stale; run python scripts/nbbuild.py --headers"
        )
        cell = nbformat.read(path, as_version=4).cells[1]
        assert f'"{SETTINGS["repository"]}", "v{SETTINGS["version"]}"' in cell.source


def test_publishing_setting_is_one_line(tmp_path):
    """A fork changes [tool.jaxlab] repository; the badge and the set-up cell follow."""
    settings = dict(SETTINGS, repository="https://github.com/a-workshop/jaxlab-fork")
    nb = tmp_path / "00_setup.ipynb"
    shutil.copy(ROOT / "notebooks" / "00_setup.ipynb", nb)
    assert nbbuild.refresh_header(nb, settings)
    cells = nbformat.read(nb, as_version=4).cells
    assert (
        "colab.research.google.com/github/a-workshop/jaxlab-fork/blob/main/notebooks/00_setup.ipynb" in cells[0].source
    )
    assert "https://github.com/a-workshop/jaxlab-fork" in cells[1].source and "jaxlab/jaxlab" not in cells[1].source
    with pytest.raises(ValueError, match="OWNER/NAME"):
        colab.badge("git@github.com:a/b.git", "x.ipynb")


def test_check_version_equal_patch_and_minor():
    assert colab.check_version("0.1.0", "0.1.0") == ""
    said = colab.check_version("0.1.0", "0.1.3")
    assert "0.1.0" in said and "0.1.3" in said and "only the patch release differs" in said and "\n" not in said
    for clone in ("0.2.0", "1.1.0", "0.10.0"):
        with pytest.raises(colab.SetupError) as e:
            colab.check_version("0.1.0", clone)
        assert str(e.value) == (
            f"this notebook was built with jaxlab 0.1.0 but the clone holds jaxlab {clone}: open the notebooks of "
            f"jaxlab {clone} (the repository's notebooks/ folder), or publish the tag v0.1.0 (README, 'Publish "
            "your copy'), delete jaxlab-src and run this cell again"
        )
    with pytest.raises(colab.SetupError):  # not a version it can compare: only equal passes
        colab.check_version("0.1.0", "main")


def _git(*args: str, cwd: Path | None = None) -> str:
    """git with no user or system configuration (the tests' repositories look the same everywhere)."""
    env = dict(os.environ, GIT_CONFIG_GLOBAL=os.devnull, GIT_CONFIG_NOSYSTEM="1")
    ident = ["-c", "user.name=colab-test", "-c", "user.email=colab-test@localhost", "-c", "init.defaultBranch=trunk"]
    return _run(["git", *ident, *args], cwd=cwd, env=env).strip()


def _run_setup_cell(cell: str, python: str, content: Path, gitconfig: Path, env: dict | None = None):
    """The set-up cell run as on Colab (a stand-in ``google.colab`` imported first) in ``content``, with the
    cell's GitHub URL redirected by ``gitconfig``. ``JAXLAB_ACCELERATOR=none`` ends colab.py at its first step
    after the source check (detecting the runtime), before pip: what is checked is the clone and its version.
    -> (what the cell printed, the last line of its error)."""
    content.mkdir(parents=True, exist_ok=True)
    env = dict(env or os.environ, GIT_CONFIG_GLOBAL=str(gitconfig), GIT_CONFIG_NOSYSTEM="1", JAXLAB_ACCELERATOR="none")
    env["PYTHONPATH"] = str(_fake_colab(content.parent / f"{content.name}-fake"))
    proc = subprocess.run(
        [python, "-c", "import google.colab\n" + cell], cwd=content, env=env, capture_output=True, text=True
    )
    assert proc.returncode == 1 and "During handling" not in proc.stderr, proc.stderr[-2000:]
    return proc.stdout, proc.stderr.strip().splitlines()[-1]


def _installed_from(out: str) -> tuple[str, str]:
    """("tag v0.1.0" or "branch main", the commit abbreviated) from colab.py's ``jaxlab source:`` line."""
    (m,) = re.findall(r"^jaxlab source: .* \((tag \S+|branch \S+), commit ([0-9a-f]{7,})\)$", out, re.M)
    return m


STOPPED = "RuntimeError: Colab set-up failed: JAXLAB_ACCELERATOR='none' is not one of tpu, gpu, cpu: fix or unset it"


def test_setup_cell_clones_the_tag_or_else_the_default_branch(tmp_path):
    """The set-up cell against a published repository: with the notebook's tag it installs the tag, even when
    the default branch is ahead; without it, the default branch, whose version colab.py then checks."""
    version = SETTINGS["version"]
    major, minor, *_ = version.split(".")
    work, bare = tmp_path / "work", tmp_path / "jaxlab.git"
    (work / "jaxlab").mkdir(parents=True)
    shutil.copy(ROOT / "jaxlab" / "colab.py", work / "jaxlab")
    pyproject = (ROOT / "pyproject.toml").read_text()

    def release(v: str) -> str:
        (work / "pyproject.toml").write_text(re.sub(r'(?m)^version = ".*"$', f'version = "{v}"', pyproject, count=1))
        _git("add", "-A", cwd=work)
        _git("commit", "-q", "-m", f"jaxlab {v}", cwd=work)
        return _git("rev-parse", "HEAD", cwd=work)

    _git("init", "-q", str(work))
    tagged = release(version)
    _git("tag", f"v{version}", cwd=work)
    ahead = release(f"{major}.{int(minor) + 1}.0")  # the default branch moved on to the next minor version
    _git("clone", "-q", "--bare", str(work), str(bare))
    gitconfig = tmp_path / "gitconfig"
    gitconfig.write_text(f'[url "file://{bare}"]\n\tinsteadOf = {SETTINGS["repository"]}\n')
    cell = colab.setup_cell(SETTINGS)

    out, last = _run_setup_cell(cell, sys.executable, tmp_path / "c1", gitconfig)
    where, commit = _installed_from(out)
    assert where == f"tag v{version}" and tagged.startswith(commit) and "patch" not in out
    assert last == STOPPED  # the version check passed

    _git("--git-dir", str(bare), "tag", "-d", f"v{version}")  # published as it is: no tags
    out, last = _run_setup_cell(cell, sys.executable, tmp_path / "c2", gitconfig)
    where, commit = _installed_from(out)
    assert where == "branch trunk" and ahead.startswith(commit)
    assert last == (
        f"RuntimeError: Colab set-up failed: this notebook was built with jaxlab {version} but the clone holds "
        f"jaxlab {major}.{int(minor) + 1}.0: open the notebooks of jaxlab {major}.{int(minor) + 1}.0 (the "
        f"repository's notebooks/ folder), or publish the tag v{version} (README, 'Publish your copy'), delete "
        "jaxlab-src and run this cell again"
    )

    patched = f"{major}.{minor}.{int(version.split('.')[2]) + 7}"
    fixed = release(patched)
    _git("push", "-q", str(bare), "HEAD:trunk", cwd=work)
    out, last = _run_setup_cell(cell, sys.executable, tmp_path / "c3", gitconfig)
    where, commit = _installed_from(out)
    assert where == "branch trunk" and fixed.startswith(commit) and last == STOPPED
    assert colab.check_version(version, patched) in out.splitlines()

    gitconfig.write_text(f'[url "file://{tmp_path / "nowhere.git"}"]\n\tinsteadOf = {SETTINGS["repository"]}\n')
    out, last = _run_setup_cell(cell, sys.executable, tmp_path / "c4", gitconfig)
    assert re.fullmatch(  # git's reason, on the one line of the error
        rf"RuntimeError: could not reach {SETTINGS['repository']} \(.*does not appear to be a git repository.*\): "
        "check the network, and that the repository is public",
        last,
    )
    assert not (tmp_path / "c4" / "jaxlab-src").exists()


def _setup_script(src: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(ROOT / "jaxlab" / "colab.py"), "install", str(src)],
        capture_output=True,
        text=True,
        env=dict(os.environ, JAXLAB_ACCELERATOR="cpu"),
    )


def test_setup_script_fails_with_one_sentence(tmp_path):
    """A failed step ends the script with exit 1 and, last, one line saying what failed and what to do."""
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "x"\nversion = "1"\ndependencies = []\n')
    proc = _setup_script(tmp_path)
    assert proc.returncode == 1 and not proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == (
        f"Colab set-up failed: {tmp_path} is not a jaxlab source tree "
        "(pyproject.toml has no 'tool'): delete it and run the cell again"
    )
    shutil.copy(ROOT / "pyproject.toml", tmp_path)  # a jaxlab tree without its Colab constraints: pip refuses
    proc = _setup_script(tmp_path)
    last = proc.stdout.strip().splitlines()[-1]
    assert proc.returncode == 1 and last.startswith(
        "Colab set-up failed: installing jax/flax and jaxlab's dependencies failed ("
    )
    assert colab.CONSTRAINTS in last and last.endswith("installs the CPU build")


def test_wheel_carries_every_module_and_every_data_file(tmp_path):
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(tmp_path),
            str(ROOT),
        ],
        check=True,
        capture_output=True,
    )
    (wheel,) = tmp_path.glob("jaxlab-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for f in (ROOT / "data").rglob("*"):
        if f.is_file():
            assert f"jaxlab/data/{f.relative_to(ROOT / 'data').as_posix()}" in names, f"{f} is not in the wheel"
    for f in (ROOT / "jaxlab").rglob("*.py"):
        assert f.relative_to(ROOT).as_posix() in names, f"{f} is not in the wheel (add its package to pyproject.toml)"
    for f in (ROOT / "jaxlab").rglob("*.cc"):  # the CPU kernel's source, built on first use
        assert f.relative_to(ROOT).as_posix() in names, f"{f} is not in the wheel (add it to package-data)"


# ---------------------------------------------------------------------------------------------------
# The simulated Colab run
# ---------------------------------------------------------------------------------------------------


def _run(cmd, **kw):
    proc = subprocess.run(cmd, capture_output=True, text=True, **kw)
    assert proc.returncode == 0, f"{cmd[:4]} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
    return proc.stdout


def _colab_image() -> Path:
    """A venv holding Colab's preinstalled packages (runtime.txt), built once per runtime.txt and Python, beside
    the test environment (``sys.prefix``, so ``make clean`` removes it), or in a temporary folder where that is
    not writable."""
    key = hashlib.sha256(RUNTIME.read_bytes() + sys.version.encode()).hexdigest()[:16]
    image = Path(sys.prefix) / f"colab-runtime-{key}"
    if (image / "ready").exists():
        return image
    try:
        partial = Path(tempfile.mkdtemp(prefix=f"{image.name}.", suffix=".partial", dir=sys.prefix))
    except OSError:
        partial = Path(tempfile.mkdtemp(prefix="colab-runtime-"))
    venv = partial / "venv"
    _run([sys.executable, "-m", "venv", str(venv)])
    _run(
        [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check", "-r", str(RUNTIME)]
    )
    (partial / "ready").write_text(RUNTIME.read_text())
    for old in image.parent.glob("colab-runtime-*"):  # images of an older runtime.txt (1 GB each)
        if old != partial and not old.name.endswith(".partial"):
            shutil.rmtree(old, ignore_errors=True)
    try:
        partial.rename(image)
    except OSError:  # another run finished first, or sys.prefix is not ours: use what is there
        if (image / "ready").exists():
            shutil.rmtree(partial, ignore_errors=True)
            return image
        return partial
    return image


def _copy_of_colab_image(venv: Path) -> None:
    """A venv at ``venv`` that starts as Colab's image: every file hard-linked (copied across file systems),
    the scripts' ``#!`` lines pointed at the copy's own python."""

    def link(src, dst):
        try:
            os.link(src, dst)
        except OSError:
            shutil.copy2(src, dst)

    shutil.copytree(_colab_image() / "venv", venv, symlinks=True, copy_function=link)
    for script in (venv / "bin").iterdir():
        if script.is_symlink() or not script.is_file():
            continue
        data = script.read_bytes()
        first, sep, rest = data.partition(b"\n")
        if first.startswith(b"#!") and b"/bin/python" in first:
            script.unlink()  # a link into the image: write a new file, not through it
            script.write_bytes(f"#!{venv / 'bin' / 'python'}".encode() + sep + rest)
            script.chmod(0o755)


def _bare_repo_of_this_tree(sim: Path) -> Path:
    """A bare repository holding this working tree (tracked and untracked-but-not-ignored files, as a
    commit would), tagged v<version> as a release is."""
    bare = sim / "jaxlab.git"
    git = ["git", "-c", "user.name=colab-sim", "-c", "user.email=colab-sim@localhost", f"--git-dir={bare}"]
    _run(["git", "init", "-q", "--bare", str(bare)])
    _run(git + [f"--work-tree={ROOT}", "add", "-A"])
    _run(git + [f"--work-tree={ROOT}", "commit", "-q", "-m", "snapshot for the Colab simulation"])
    _run(git + ["tag", f"v{SETTINGS['version']}"])
    return bare


def _fake_colab(sim: Path) -> Path:
    pkg = sim / "fake" / "google" / "colab"  # no google/__init__.py: google stays a namespace (protobuf)
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text('"""A stand-in for Colab\'s google.colab (the Colab simulation only)."""\n')
    (pkg / "output.py").write_text(
        "import os\n\n\ndef enable_custom_widget_manager():\n"
        "    open(os.environ['COLAB_SIM_MARKS'], 'a').write('enable_custom_widget_manager\\n')\n"
    )
    return sim / "fake"


@pytest.mark.install
@pytest.mark.slow
def test_colab_simulation(tmp_path):
    sim = tmp_path
    venv = sim / "colab-venv"
    _copy_of_colab_image(venv)
    py = str(venv / "bin" / "python")
    assert colab.pins(_run([py, "-m", "pip", "freeze"]).splitlines()).items() >= colab_versions().items()
    bare = _bare_repo_of_this_tree(sim)
    (sim / "gitconfig").write_text(f'[url "file://{bare}"]\n\tinsteadOf = {SETTINGS["repository"]}\n')
    content = sim / "content"  # Colab's working folder
    content.mkdir()
    shutil.copy(ROOT / "notebooks" / "00_setup.ipynb", content)
    marks = sim / "marks.txt"
    env = {k: v for k, v in os.environ.items() if k not in ("JAXLAB_DATA", "VIRTUAL_ENV", "PYTHONPATH")}
    env.update(
        PATH=f"{venv / 'bin'}:{env['PATH']}",
        PYTHONPATH=str(_fake_colab(sim)),
        GIT_CONFIG_GLOBAL=str(sim / "gitconfig"),
        JAXLAB_CACHE=str(sim / "cache"),
        COLAB_SIM_MARKS=str(marks),
    )
    kernels = sim / "jupyter" / "kernels" / "colab-sim"
    kernels.mkdir(parents=True)
    (kernels / "kernel.json").write_text(
        json.dumps(
            {
                "argv": [
                    py,
                    "-m",
                    "ipykernel_launcher",
                    "-f",
                    "{connection_file}",
                    "--IPKernelApp.exec_lines=['import google.colab']",
                ],
                "display_name": "Colab (simulated)",
                "language": "python",
                "env": env,
            }
        )
    )
    test_env = dict(os.environ, JUPYTER_PATH=str(sim / "jupyter"))
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-x",
            "-p",
            "no:cacheprovider",
            "--nbval",
            "--nbval-kernel-name",
            "colab-sim",
            "--nbval-sanitize-with",
            str(ROOT / "notebooks" / "nbval_sanitize.cfg"),
            "--nbval-cell-timeout",
            "600",
            "-o",
            "addopts=",
            str(content / "00_setup.ipynb"),
        ],
        cwd=content,
        env=test_env,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, f"notebook 00 on simulated Colab:\n{proc.stdout[-6000:]}\n{proc.stderr[-2000:]}"
    assert re.search(r"\d+ passed", proc.stdout)
    print(proc.stdout.strip().splitlines()[-1])
    got = json.loads(
        _run(
            [
                py,
                "-c",
                "import json; from importlib import metadata as m; print(json.dumps({p: m.version(p) "
                "for p in ('jax', 'jaxlib', 'flax', 'numpy', 'matplotlib', 'ipywidgets', 'jaxlab')}))",
            ],
            cwd=content,
        )
    )
    want = colab.pins(SETTINGS["dependencies"])
    theirs = colab_versions()
    assert {k: got[k] for k in ("jax", "jaxlib", "flax")} == {k: want[k] for k in ("jax", "jaxlib", "flax")}
    assert {k: got[k] for k in ("numpy", "matplotlib", "ipywidgets")} == {
        k: theirs[k] for k in ("numpy", "matplotlib", "ipywidgets")
    }
    assert got["jaxlab"] == SETTINGS["version"]
    site = Path(_run([py, "-c", "import jaxlab, os; print(os.path.dirname(jaxlab.__file__))"], cwd=content).strip())
    assert site.is_relative_to(venv) and (site / "data" / "reference").is_dir(), (
        "jaxlab must come from the wheel, data included"
    )
    assert marks.read_text().splitlines() == ["enable_custom_widget_manager"]

    # notebook 12 on Colab: the server and the openai client with the versions the runtime kept
    served = json.loads(_run([py, "-c", COLAB_SERVE], cwd=content, env=env).splitlines()[-1])
    serve_pkgs = ("starlette", "uvicorn", "prometheus-client", "openai")
    assert {k: served[k] for k in serve_pkgs} == {k: theirs[k] for k in serve_pkgs}, "Colab's versions must stay"
    assert served["status"] == 200 and served["completion_tokens"] == 4 and served["text"]

    # The same repository published as it is, without tags: the notebook's cell installs the default branch.
    # Only its clone-and-version step runs again (the packages above are installed): _run_setup_cell ends
    # colab.py right after that step.
    _git("--git-dir", str(bare), "tag", "-d", f"v{SETTINGS['version']}")
    cell = nbformat.read(content / "00_setup.ipynb", as_version=4).cells[1].source
    out, last = _run_setup_cell(cell, py, sim / "untagged", sim / "gitconfig", env)
    where, commit = _installed_from(out)
    assert where == f"branch {_git('--git-dir', str(bare), 'symbolic-ref', '--short', 'HEAD')}"
    assert _git("--git-dir", str(bare), "rev-parse", "HEAD").startswith(commit) and last == STOPPED


# A server on a thread (as notebook 12 starts it) over a 2-slot engine, called with the openai client.
COLAB_SERVE = """
import json
from importlib import metadata

from openai import OpenAI

import jaxlab
from jaxlab.engine.continuous import Engine
from jaxlab.serve import BackgroundServer, ServeOptions

m = jaxlab.load()
with BackgroundServer(Engine(m.params, m.tokenizer, slots=2, context=64), ServeOptions(model_name="smollm2-135m")) as s:
    r = OpenAI(base_url=s.url + "/v1", api_key="colab", max_retries=0).chat.completions.with_raw_response.create(
        model="smollm2-135m", messages=[{"role": "user", "content": "Hi"}], max_tokens=4, temperature=0,
        extra_body={"ignore_eos": True},
    )
    answer = r.parse()
    out = {p: metadata.version(p) for p in ("starlette", "uvicorn", "prometheus-client", "openai")}
    out.update(status=r.status_code, completion_tokens=answer.usage.completion_tokens, text=answer.choices[0].message.content)
print(json.dumps(out))
"""
