"""Shared fixtures, each made once per session: the embedded model (``smollm``; ``load_once`` shares it with
``jaxlab.cli.main`` in this process), a generator over it, a cache folder holding its converted parameters,
the reference (transformers), the golden file and the embedded model's measurement on it (``golden_measured``).
Helpers for the tests: ``load_solution`` (the exercises' solutions) and ``hf_llama_tensors`` (a checkpoint in
Hugging Face layout).

Parity figures recorded with the ``parity`` fixture are printed at the end of the run.

``make test`` runs the notebooks and the tests in one run, whole files per worker (``--dist loadfile
--no-loadscope-reorder`` keeps the order given here): the notebooks first, while the workers are fresh (a worker
grows to several GB over the tests, and two of them beside two notebook kernels did not fit in 24 GB), then the
tests, longest file first (``tests/durations.json``, seconds per file measured in a whole ``make test``), so the
run ends on short files and neither worker idles long at the end. ``JAXLAB_DURATIONS=tests/durations.json make
test`` measures and rewrites the table (the host's CPU and the date go with it).

One persistent compilation cache serves the whole run (``JAXLAB_COMPILE_CACHE``, unless set): a folder made
empty for this run (by the controller of a ``pytest -n 2`` run, whose workers share it), so a run on a fresh machine and a run here cost the same, and the user's cache
(``~/.cache/jaxlab/jax``) is neither read nor written. This process turns it on at once; the command-line
subprocesses, the exported-program children and the notebooks' kernels inherit the variable. A program
compiled once (a Generator's prefill, a quantized decode step) is then loaded, not compiled again, by every
later process or program object that lowers to the same computation. Tests that measure a cold compile give
their own empty folder.
"""

from __future__ import annotations

import functools
import importlib.util
import inspect
import json
import os
import shutil
import tempfile
import time
from pathlib import Path

os.environ.setdefault("JAX_PLATFORMS", "cpu")
#: Loaded weights stay on XLA's own pages in the tests and the processes they start (jaxlab.engine.hugepages): on
#: this project's VMs the kernel takes ~1.5 s to hand a process 540 MB of fresh 2 MB pages, paid by every load,
#: and a page's size changes no result. tests/engine/test_hugepages.py turns them on and checks them.
os.environ.setdefault("JAXLAB_HUGE_PAGES", "0")

import jax  # noqa: E402
import pytest  # noqa: E402

#: Every test process sees this many simulated CPU devices, so the mesh tests run in it, next to the others, and
#: no test restarts JAX to get them. ``jax_num_cpu_devices`` is a setting of this process, not an environment
#: variable: the command lines, servers and notebook kernels the tests start see the machine's one CPU device, as
#: users do. Code on one device runs on the first.
TEST_DEVICES = 8
jax.config.update("jax_num_cpu_devices", TEST_DEVICES)

_OWN_COMPILE_CACHE = None
if "JAXLAB_COMPILE_CACHE" not in os.environ:
    _OWN_COMPILE_CACHE = tempfile.mkdtemp(prefix="jaxlab-tests-compile-cache-")
    os.environ["JAXLAB_COMPILE_CACHE"] = _OWN_COMPILE_CACHE


@pytest.fixture(scope="session", autouse=True)
def shared_compile_cache():
    """The run's persistent compilation cache, on in this process (each worker's, under pytest-xdist)."""
    from jaxlab.tools import compile_cache

    return compile_cache.enable()


def pytest_unconfigure(config):
    """The cache folder goes when the process that made it ends: the only process of a plain run, the controller
    of an xdist run (its workers inherit the variable, so they share the folder and never made one)."""
    if _OWN_COMPILE_CACHE:
        shutil.rmtree(_OWN_COMPILE_CACHE, ignore_errors=True)


@functools.cache
def _jitted_forward():
    import jax

    from jaxlab.engine.model import forward

    return jax.jit(forward, static_argnames=("last_only", "upto", "reduce", "remat"))


def jit_forward(*args, **kwargs):
    """``jaxlab.engine.model.forward`` under ``jit``: one compilation per shape instead of one per operation, as
    running it eagerly costs (tens of seconds for a few decode steps of the tiny model). A test that changes a
    module global the pass reads (a monkeypatched constant) runs ``forward`` eagerly instead: a jitted trace
    of the same shapes is reused and would not see the change."""
    return _jitted_forward()(*args, **kwargs)


def run_main(capsys, args):
    """`jaxlab.cli.main` in this process: (exit code, stdout, stderr)."""
    from jaxlab.cli import main

    try:
        code = main(args)
    except SystemExit as e:  # argparse
        code = e.code
    out, err = capsys.readouterr()
    return code, out, err


def one_clean_line(err: str):
    """The one line a failed command wrote on stderr (and no traceback)."""
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1, f"expected one line on stderr, got:\n{err}"
    assert "Traceback" not in err
    return lines[0]


_PARITY: list[str] = []
_MEASURED: list[str] = []
SOLUTIONS = Path(__file__).resolve().parent.parent / "notebooks" / "solutions"


def not_implemented(*args):
    """An exercise left as the notebook hands it out: its checker must report it, not pass it or crash."""
    raise NotImplementedError


def load_solution(name: str):
    """The module notebooks/solutions/<name>.py (the exercises' solutions), imported from its path."""
    spec = importlib.util.spec_from_file_location(f"solution_{name}", SOLUTIONS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def gguf_path():
    from jaxlab.io import assets

    return assets.model_path()


_LOADED: dict = {}


def load_model(*args, **kwargs):
    """``jaxlab.engine.loading.load``, each distinct request once per session: the key is the bound arguments
    (progress bars aside) and the cache folder (``JAXLAB_CACHE``). Reading the model and building its tokenizer
    takes seconds; tests that run the command line in this process ask for the same model many times
    (``load_once``)."""
    from jaxlab.engine import loading

    real = getattr(loading.load, "__wrapped__", loading.load)
    bound = inspect.signature(real).bind(*args, **kwargs)
    bound.apply_defaults()
    key = tuple((k, v) for k, v in bound.arguments.items() if k != "progress") + (os.environ.get("JAXLAB_CACHE"),)
    if key not in _LOADED:
        _LOADED[key] = real(*args, **kwargs)
    return _LOADED[key]


def share_loads(mp: pytest.MonkeyPatch) -> None:
    """``jaxlab.engine.loading.load`` replaced by :func:`load_model` (until ``mp`` undoes it): ``jaxlab.cli.main``
    in this process then shares the session's models instead of reading them again."""
    from jaxlab.engine import loading

    mp.setattr(loading, "load", functools.wraps(loading.load)(load_model))


@pytest.fixture
def load_once(monkeypatch):
    """:func:`share_loads` for one test."""
    share_loads(monkeypatch)


@pytest.fixture(scope="session")
def smollm(gguf_path):
    """The embedded SmolLM2-135M (params + tokenizer), float32."""
    return load_model()


#: Layers of :func:`small_gguf`'s model: enough for a cache, a draft (``--draft-layers 1``) and tensor-parallel
#: blocks, few enough that its programs compile in a fraction of the embedded model's time.
SMALL_LAYERS = 2


@pytest.fixture(scope="session")
def small_gguf(smollm, converted_cache):
    """The embedded model cut to its first :data:`SMALL_LAYERS` layers (its own weights, norm, head and tokenizer) as a
    GGUF file (F32) in the tests' cache folder: for the tests of wiring (flags, report sections, request handling)
    that need a real file, a real tokenizer and answers that are not noise, but not the whole model. Each face keeps
    checks on the whole model (README, "Tests"). Use it through :func:`small`, which points ``JAXLAB_CACHE`` at that
    folder so its converted parameters stay there."""
    from jaxlab.engine.model import params_from_flat
    from jaxlab.io.export import export_gguf

    keep = {
        name: value
        for name, value in smollm.params.flat().items()
        if not name.startswith("layers.") or int(name.split(".")[1]) < SMALL_LAYERS
    }
    params = params_from_flat(smollm.config.replace(n_layers=SMALL_LAYERS), keep, smollm.params.policy)
    folder = converted_cache / "test-models"
    folder.mkdir(exist_ok=True)
    return export_gguf(params, smollm.tokenizer, folder / "smollm2-2-layers.gguf", qtype="F32")


@pytest.fixture
def small(small_gguf, converted_cache, monkeypatch) -> str:
    """``--model`` for :func:`small_gguf`, with ``JAXLAB_CACHE`` (this process and its children) set to the tests'
    cache folder that holds it."""
    monkeypatch.setenv("JAXLAB_CACHE", str(converted_cache))
    return str(small_gguf)


@pytest.fixture(scope="session")
def small_model(small_gguf, converted_cache):
    """:func:`small_gguf` loaded (params + tokenizer, float32), once per session, as ``jaxlab generate --model`` loads
    it (the same :func:`load_model` entry)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("JAXLAB_CACHE", str(converted_cache))
        return load_model(str(small_gguf))


@pytest.fixture(scope="session")
def generator(smollm):
    from jaxlab.engine.generate import Generator

    return Generator(smollm.params, smollm.tokenizer)


@pytest.fixture(scope="session")
def converted_cache(tmp_path_factory, gguf_path):
    """A cache folder of the tests' own (the user's stays untouched) holding the embedded model's float
    parameters, once per session: tests of the quantized-parameter cache write next to them, and the quantized
    files one test leaves there spare the next the quantizing (a test that needs a file fresh deletes it first).

    The file is copied from the cache the session's model was read from (``JAXLAB_CACHE`` or ``~/.cache/jaxlab``)
    when that holds it: its name carries the GGUF's identity (path, size, time) and the converter's version, the
    test the loader itself trusts, so the copy is the file a conversion would write; converting the whole model
    again cost 15-40 s per test process. Without it, the parameters are converted here."""
    from jaxlab.engine import loading
    from jaxlab.io import assets, param_cache

    path = tmp_path_factory.mktemp("cache")
    src = param_cache.params_file(assets.cache_dir(), gguf_path)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("JAXLAB_CACHE", str(path))
        dst = param_cache.params_file(assets.cache_dir(), gguf_path)
        if src.is_file():
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src, dst.with_suffix(".partial"))
            os.replace(dst.with_suffix(".partial"), dst)
        else:
            loading.load_params()
    return path


@pytest.fixture(scope="session")
def reference(gguf_path):
    """(model, tokenizer) of Hugging Face transformers on the same GGUF, float32 CPU, on one torch thread: decoding
    one token at a time, a 135M model gains little from a second thread, and where the cores are shared torch's
    waiting workers slow it down tenfold (one greedy run of 32 tokens: 29-49 s on two threads, 2.7-3.7 s on one,
    on a busy two-core machine)."""
    import torch

    from jaxlab.tools.reference import load_reference

    torch.set_num_threads(1)
    return load_reference(gguf_path)


@pytest.fixture(scope="session")
def golden():
    """The golden file (data/reference/): the reference's prompt ids, greedy tokens and last logits."""
    from jaxlab.tools.reference import load_golden

    return load_golden()


@pytest.fixture(scope="session")
def golden_measured(smollm, golden):
    """The embedded float32 model run once on the golden prompts (``measure_golden``): {"last_logits" [P, V],
    "greedy" [P][n], "teacher_argmax" [P][n]}, for every test that judges it (``judge_golden``)."""
    from jaxlab.tools.reference import measure_golden

    return measure_golden(smollm.params, golden)


def hf_llama_tensors(hf_config: dict, rng) -> dict:
    """Random float32 tensors of a Llama checkpoint in Hugging Face layout (``model.layers.{i}.self_attn.q_proj
    .weight`` [out, in], ...), named and shaped from its config.json alone, as ``transformers`` saves them: the
    tests write checkpoints without asking jaxlab's reader which names it expects."""
    d, f, layers = hf_config["hidden_size"], hf_config["intermediate_size"], hf_config["num_hidden_layers"]
    heads, kv = hf_config["num_attention_heads"], hf_config.get("num_key_value_heads", hf_config["num_attention_heads"])
    hd = hf_config.get("head_dim", d // heads)
    shapes = {"model.embed_tokens.weight": (hf_config["vocab_size"], d), "model.norm.weight": (d,)}
    if not hf_config.get("tie_word_embeddings", False):
        shapes["lm_head.weight"] = (hf_config["vocab_size"], d)
    for i in range(layers):
        h = f"model.layers.{i}."
        shapes |= {
            h + "input_layernorm.weight": (d,),
            h + "self_attn.q_proj.weight": (heads * hd, d),
            h + "self_attn.k_proj.weight": (kv * hd, d),
            h + "self_attn.v_proj.weight": (kv * hd, d),
            h + "self_attn.o_proj.weight": (d, heads * hd),
            h + "post_attention_layernorm.weight": (d,),
            h + "mlp.gate_proj.weight": (f, d),
            h + "mlp.up_proj.weight": (f, d),
            h + "mlp.down_proj.weight": (d, f),
        }
    return {name: (rng.standard_normal(shape) * 0.1).astype("float32") for name, shape in shapes.items()}


@pytest.fixture(scope="session")
def parity():
    """parity(line): record a measured parity figure for the end-of-run summary."""
    return _PARITY.append


@pytest.fixture(scope="session")
def measured():
    """measured(line): record a figure a test measured (a load test's latencies) for the end-of-run summary."""
    return _MEASURED.append


def pytest_sessionfinish(session):
    """Under pytest-xdist, a worker hands its summary lines to the controller, which prints them (and writes the
    durations table when asked)."""
    _write_durations(session)
    if hasattr(session.config, "workeroutput"):
        session.config.workeroutput["parity"] = list(_PARITY)
        session.config.workeroutput["measured"] = list(_MEASURED)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    out = getattr(node, "workeroutput", {})
    _PARITY.extend(out.get("parity", []))
    _MEASURED.extend(out.get("measured", []))


DURATIONS = Path(__file__).resolve().parent / "durations.json"
_FILE_SECONDS: dict[str, float] = {}


def _file_of(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


def pytest_collection_modifyitems(config, items):
    """Notebooks first, then test files; each longest first (``durations.json``), a file it does not know yet after
    the known ones, in collection order."""
    seconds = json.loads(DURATIONS.read_text())["seconds"] if DURATIONS.exists() else {}
    first_seen: dict[str, int] = {}
    for i, item in enumerate(items):
        first_seen.setdefault(_file_of(item.nodeid), i)

    def order(item):
        f = _file_of(item.nodeid)
        return (not f.endswith(".ipynb"), -seconds.get(f, 0.0), first_seen[f])

    items.sort(key=order)


def pytest_runtest_logreport(report):
    """With ``JAXLAB_DURATIONS`` set, add up each file's seconds (set-up, call and teardown) in the controller."""
    if os.environ.get("JAXLAB_DURATIONS"):
        _FILE_SECONDS[_file_of(report.nodeid)] = _FILE_SECONDS.get(_file_of(report.nodeid), 0.0) + report.duration


def _write_durations(session) -> None:
    if not os.environ.get("JAXLAB_DURATIONS") or hasattr(session.config, "workerinput") or not _FILE_SECONDS:
        return
    from jaxlab.tools.hardware import cpu_name

    table = {
        "measured": f"make test on {cpu_name()}, {os.cpu_count()} cores, {time.strftime('%Y-%m-%d')}",
        "seconds": {f: round(s, 1) for f, s in sorted(_FILE_SECONDS.items(), key=lambda kv: -kv[1])},
    }
    Path(os.environ["JAXLAB_DURATIONS"]).write_text(json.dumps(table, indent=1) + "\n")


def pytest_terminal_summary(terminalreporter):
    for title, lines in (
        ("parity with the reference (transformers, float32)", _PARITY),
        ("measured in this run", _MEASURED),
    ):
        if lines:
            terminalreporter.section(title)
            for line in lines:
                terminalreporter.write_line(line)


SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]  # ids 0, 1, 2: the tiny config's bos 1 and eos 2


def byte_tokenizer():
    """A byte-level tokenizer for the tiny model's 263 ids: three specials, the 256 bytes, a few merges."""
    from tokenizers import AddedToken, decoders, models, pre_tokenizers
    from tokenizers import Tokenizer as Backend

    from jaxlab.io.tokenizer import Tokenizer, bytes_to_unicode

    spell = bytes_to_unicode()
    alphabet = list(spell.values())
    merged = ['{"', '":', "ok", "no"]
    spelled = ["".join(spell[b] for b in m.encode()) for m in merged]
    vocab = {t: i for i, t in enumerate(SPECIALS + alphabet + spelled)}
    merges = [(s[0], s[1:]) for s in spelled]
    backend = Backend(models.BPE(vocab=vocab, merges=merges, fuse_unk=False))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    backend.decoder = decoders.ByteLevel()
    backend.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIALS])
    return Tokenizer(backend, bos_id=1, eos_id=2, pad_id=2, special_ids=[0, 1, 2])
