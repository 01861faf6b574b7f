"""jax.export of the decode step, the persistent compilation cache across processes, trace reading,
and notebook 07's exercise checkers.

The round trips are real: a program is exported and saved here, then loaded and run by a fresh Python
process, and its tokens must equal (bitwise) and its logits match (1e-6) the in-process jitted step of the same
code (XLA's: an export never holds jaxlab's CPU kernels).
Most tests use the ``tiny`` config; one a model read from a file (the embedded SmolLM2-135M's first two layers).
Notebook 07 runs the whole embedded model's exported step in a fresh process against the golden tokens."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxlab.engine.kernels import cpu as cpu_kernels
from jaxlab.engine.kvcache import init_cache
from jaxlab.errors import ConfigError, ModelFileError
from jaxlab.lab.exercises import nb07
from jaxlab.tools import program_export
from jaxlab.tools.profile import trace

SOLUTIONS = Path(__file__).resolve().parents[2] / "notebooks" / "solutions"
PROMPTS = [[5, 6, 7, 8, 9], [11, 12]]  # ragged: the second row is left-padded
NEW, CACHE = 6, 16


@pytest.fixture(scope="module")
def serializable():
    """Exported.serialize() needs the flatbuffers package."""
    pytest.importorskip("flatbuffers", reason="jax.export serialization needs flatbuffers (add it to the dependencies)")


@pytest.fixture(scope="module")
def tiny():
    return program_export.tiny_params()


def jitted_as_exported(params, prompts, n, cache_len):
    """Greedy tokens and last logits of the in-process jitted step with the code an export holds: XLA's (on a CPU
    with AVX-512 a jitted step otherwise runs a decode step's few rows on jaxlab's kernels, whose sums run in
    another order; ``tests/engine/kernels/test_cpu.py`` compares those with XLA's)."""
    with cpu_kernels.xla_only():
        return program_export.greedy_decode(jax.jit(program_export.decode_step), params, prompts, n, cache_len)


@pytest.fixture(scope="module")
def native(tiny):
    """Greedy tokens and last logits of the in-process jitted step (the exported program's code)."""
    return jitted_as_exported(tiny, PROMPTS, NEW, CACHE)


@pytest.fixture(scope="module")
def exported(tiny):
    """The step exported for the test prompts' batch: exported once, its compiled call shared by the tests."""
    return program_export.export_decode_step(tiny, batch=len(PROMPTS), cache_len=CACHE)


@pytest.fixture(scope="module")
def exported_file(exported, tmp_path_factory, serializable):
    return program_export.save(exported, tmp_path_factory.mktemp("export") / "tiny_step.jaxexport")


# ------------------------------------------------------------------------------ the step itself


def test_greedy_decode_with_the_native_step_matches_the_generator(tiny, native):
    from jaxlab.engine.generate import Generator

    tokens, logits = native
    assert tokens.shape == (len(PROMPTS), NEW) and logits.shape == (len(PROMPTS), tiny.config.vocab_size)
    results = Generator(tiny).generate(PROMPTS, NEW, ignore_eos=True)
    assert [r.generated_ids for r in results] == tokens.tolist()
    assert len(set(tokens[0].tolist())) > 1, "weights too small: the tokens do not vary"


def test_exported_step_in_process_equals_the_jitted_step(tiny, native, exported):
    assert exported.platforms == (jax.default_backend(),)
    tokens, logits = program_export.greedy_decode(
        lambda *a: program_export.run_exported(exported, *a), tiny, PROMPTS, NEW, CACHE
    )
    np.testing.assert_array_equal(tokens, native[0])
    np.testing.assert_allclose(logits, native[1], rtol=1e-6, atol=1e-6)


def test_symbolic_batch_serves_every_batch_size(tiny, native):
    """One file for a batch of one and for the test prompts' ragged batch of two (whose jitted-step answer is
    ``native``)."""
    exported = program_export.export_decode_step(tiny, batch=None, cache_len=CACHE)
    assert str(exported.in_avals[len(jax.tree.leaves(tiny))].shape[0]) == "b"
    one = [[5, 6, 7]]
    for prompts, n, want in (
        (one, 3, jitted_as_exported(tiny, one, 3, CACHE)),
        (PROMPTS, NEW, native),
    ):
        got = program_export.greedy_decode(
            lambda *a: program_export.run_exported(exported, *a), tiny, prompts, n, CACHE
        )
        assert got[0].shape == (len(prompts), n)
        np.testing.assert_array_equal(got[0], want[0])
        # a symbolic batch's norms and softmaxes run without rows_alike's copies (their size is unknown when
        # exported), so small rows are summed in XLA:CPU's other order: the last bits differ
        np.testing.assert_allclose(got[1], want[1], rtol=1e-5, atol=1e-5)


def test_multi_platform_export_runs_here(tiny, native, serializable):
    exported = program_export.export_decode_step(
        tiny, batch=len(PROMPTS), cache_len=CACHE, platforms=("cpu", "cuda", "tpu")
    )
    assert exported.platforms == ("cpu", "cuda", "tpu")
    again = jax.export.deserialize(exported.serialize())
    tokens, _ = program_export.greedy_decode(
        lambda *a: program_export.run_exported(again, *a), tiny, PROMPTS, NEW, CACHE
    )
    np.testing.assert_array_equal(tokens, native[0])


def test_run_exported_names_the_argument_that_does_not_fit(tiny, exported):
    tok = jnp.zeros((2,), jnp.int32)
    with pytest.raises(ConfigError, match="cache.k\\[0\\].*export it again"):
        program_export.run_exported(exported, tiny, tok, tok, init_cache(tiny.config, 2, CACHE + 1))
    with pytest.raises(ConfigError, match="tokens"):
        one = jnp.zeros((1,), jnp.int32)
        program_export.run_exported(exported, tiny, one, one, init_cache(tiny.config, 2, CACHE))
    from jaxlab.engine.model import params_from_flat
    from jaxlab.io.config import param_shapes

    cfg = tiny.config.replace(n_layers=2)  # zeros from NumPy: only the tree's size matters here
    shallower = params_from_flat(cfg, {n: np.zeros(s, np.float32) for n, s in param_shapes(cfg).items()})
    with pytest.raises(ConfigError, match="another model config"):
        program_export.run_exported(exported, shallower, tok, tok, init_cache(shallower.config, 2, CACHE))


# ------------------------------------------------------------------------------ files and fresh processes


def test_round_trip_through_a_file_in_a_fresh_process(exported_file, native):
    """The child shares the run's compilation cache, as notebook 07's does: the program this process compiled for
    the same file (``test_exported_step_in_process_equals_the_jitted_step``) is loaded, not compiled again."""
    from jaxlab.tools import compile_cache

    assert exported_file.read_bytes().startswith(program_export.MAGIC)
    out = program_export.exported_in_fresh_process(
        exported_file, PROMPTS, NEW, CACHE, model="tiny", cache_dir=compile_cache.current()
    )
    np.testing.assert_array_equal(out["tokens"], native[0])
    np.testing.assert_allclose(out["logits"], native[1], rtol=1e-6, atol=1e-6)
    assert out["fun_name"] == "step" and out["platform"] == jax.default_backend()


def test_load_accepts_a_bare_serialized_payload(exported_file, tmp_path, tiny, native):
    bare = tmp_path / "bare.bin"
    bare.write_bytes(exported_file.read_bytes()[len(program_export.MAGIC) + 32 :])
    loaded = program_export.load(bare)
    tokens, _ = program_export.greedy_decode(
        lambda *a: program_export.run_exported(loaded, *a), tiny, PROMPTS, NEW, CACHE
    )
    np.testing.assert_array_equal(tokens, native[0])


def test_load_errors(exported_file, tmp_path):
    with pytest.raises(ModelFileError, match="not found"):
        program_export.load(tmp_path / "missing.jaxexport")
    empty = tmp_path / "empty.jaxexport"
    empty.write_bytes(b"")
    with pytest.raises(ModelFileError, match="empty"):
        program_export.load(empty)
    data = exported_file.read_bytes()
    truncated = tmp_path / "truncated.jaxexport"
    truncated.write_bytes(data[: len(data) // 2])
    with pytest.raises(ModelFileError, match="checksum"):
        program_export.load(truncated)
    flipped = bytearray(data)
    flipped[-100] ^= 0xFF
    corrupt = tmp_path / "corrupt.jaxexport"
    corrupt.write_bytes(bytes(flipped))
    with pytest.raises(ModelFileError, match="corrupt"):
        program_export.load(corrupt)
    foreign = tmp_path / "foreign.bin"
    foreign.write_bytes(b"GGUF" + bytes(range(256)) * 4)
    with pytest.raises(ModelFileError, match="not an exported jax program"):
        program_export.load(foreign)


def test_save_leaves_no_temporary_file(exported_file):
    assert [p.name for p in exported_file.parent.iterdir()] == [exported_file.name]


@pytest.mark.slow
def test_file_model_round_trip_in_a_fresh_process(small_model, small, tmp_path, serializable):
    """A model read from a GGUF file (the embedded model's first two layers), exported and run by a fresh process
    that loads the same file: the weights are arguments, not in the file. The whole model's exported step in a fresh
    process (its size, tokens, logits, and the golden tokens) is notebook 07's section 7 (nbval checks its PASS
    lines); in-process, its decode step's golden tokens are the notebook's section 1."""
    from jaxlab.tools.reference import load_golden

    golden = load_golden()["prompts"][0]
    prompt, n, cache_len = golden["prompt_ids"], 4, 64
    exported = program_export.export_decode_step(small_model.params, batch=1, cache_len=cache_len)
    path = program_export.save(exported, tmp_path / "small_step.jaxexport")
    assert path.stat().st_size < 0.01 * small_model.params.nbytes(), "the weights must not be baked into the file"
    want = jitted_as_exported(small_model.params, [prompt], n, cache_len)
    assert len(set(want[0][0].tolist())) > 1, "the tokens do not vary"
    kernels = program_export.greedy_decode(
        jax.jit(program_export.decode_step), small_model.params, [prompt], n, cache_len
    )
    np.testing.assert_array_equal(kernels[0], want[0])  # this host's step (its kernels, where they run) too
    got = program_export.exported_in_fresh_process(path, [prompt], n, cache_len, model=small)
    np.testing.assert_array_equal(got["tokens"], want[0])
    np.testing.assert_allclose(got["logits"], want[1], rtol=1e-6, atol=1e-6)


# ------------------------------------------------------------------------------ persistent compilation cache


def test_persistent_cache_is_shared_across_processes(tmp_path):
    cache_dir = tmp_path / "jax-cache"
    first = program_export.compile_in_fresh_process(cache_dir, model="tiny", batch=2, cache_len=CACHE)
    assert first["compiles"] >= 1 and first["cache_hits"] == 0
    assert first["cache_files"] > 0 and any(cache_dir.iterdir()), "the first process wrote no cache files"
    second = program_export.compile_in_fresh_process(cache_dir, model="tiny", batch=2, cache_len=CACHE)
    assert second["cache_hits"] >= 1 and second["cache_hits"] == second["compiles"], second
    # (its compile time is usually much lower too, but timings are not asserted)


def test_child_on_a_platform_the_file_was_not_lowered_for_says_so(tiny, tmp_path):
    """A TPU kernel's child runs on the CPU (the TPU belongs to the kernel): a TPU-only file must say so."""
    tpu_only = program_export.save(
        program_export.export_decode_step(tiny, batch=1, cache_len=CACHE, platforms=("tpu",)),
        tmp_path / "tpu.jaxexport",
    )
    with pytest.raises(RuntimeError, match=r"lowered for tpu, and this process runs on cpu: export it with platforms"):
        program_export.exported_in_fresh_process(tpu_only, PROMPTS[:1], 2, CACHE, model="tiny")


def test_child_process_failure_is_reported():
    with pytest.raises(RuntimeError, match="unknown command"):
        program_export.run_child("no-such-command", {}, None)


# ------------------------------------------------------------------------------ trace reading


def test_top_ops_reads_a_trace(tiny, tmp_path):
    step = jax.jit(program_export.decode_step)
    cache = init_cache(tiny.config, 1, CACHE)
    tok = jnp.array([5], jnp.int32)
    jax.block_until_ready(step(tiny, tok, tok, cache))
    logdir = trace(step, tiny, tok, tok, cache, logdir=tmp_path / "trace")
    from jaxlab.tools.profile import hlo_text

    hlo = hlo_text(step, tiny, tok, tok, cache)
    rows = program_export.top_ops(logdir, 5, hlo=hlo)
    assert 0 < len(rows) <= 5
    assert [r["ms"] for r in rows] == sorted((r["ms"] for r in rows), reverse=True)
    assert all(r["calls"] >= 1 and 0 <= r["share"] <= 1 for r in rows)
    grouped = program_export.top_ops(logdir, 50, hlo=hlo, by="weight")
    names = {r["op"] for r in grouped}
    assert "layers.*.mlp.w_up" in names, names
    up = next(r for r in grouped if r["op"] == "layers.*.mlp.w_up")
    assert up["calls"] == tiny.config.n_layers
    assert abs(sum(r["share"] for r in grouped) - 1) < 1e-6
    with pytest.raises(ValueError):
        program_export.top_ops(logdir, by="weight")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelFileError, match="no \\*.trace.json.gz"):
        program_export.top_ops(tmp_path / "empty")


def test_weight_names_from_hlo_parameter_names():
    hlo = (
        "  %dot.7 = f32[1,84]{1,0} dot(%x, %params_0___layers___3___mlp____w_up___value), lhs_contracting_dims={1}\n"
        "  ROOT %fusion.2 = f32[1,1,40]{2,1,0} fusion(%params_0___embed___value, %tok), kind=kLoop\n"
        "  %add.1 = f32[4]{0} add(%a, %b)\n"
    )
    assert program_export.weights_read(hlo) == {"dot.7": ["layers.3.mlp.w_up"], "fusion.2": ["embed"]}


# ------------------------------------------------------------------------------ exercises


def load_solution(name):
    spec = importlib.util.spec_from_file_location(f"solution_{name}", SOLUTIONS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def stub(*args):
    raise NotImplementedError


def test_nb07_checkers_fail_on_wrong_answers_and_pass_on_the_solutions(capsys):
    sol = load_solution("07_profiling_and_compilation")
    assert not nb07.check_matmul_intensity(stub)
    assert not nb07.check_time_bound(stub)
    assert not nb07.check_compile_then_run(stub)
    assert capsys.readouterr().out.count("not implemented yet") == 3

    assert not nb07.check_matmul_intensity(lambda m, k, n, i: 2 * m * k * n / ((m * k + k * n) * i))  # forgot C
    assert not nb07.check_time_bound(lambda bw, peak, f, b: f / peak + b / bw)  # sum, not max
    assert "differ" in capsys.readouterr().out

    def runs_twice(jitted, *args):  # "compiles" by calling: the program runs twice
        import time

        t0 = time.perf_counter()
        jax.block_until_ready(jitted(*args))
        t1 = time.perf_counter()
        out = jax.block_until_ready(jitted(*args))
        return t1 - t0, time.perf_counter() - t1, out

    assert not nb07.check_compile_then_run(runs_twice)
    assert "ran 2 times" in capsys.readouterr().out
    assert not nb07.check_compile_then_run(lambda j, *a: (0.0, 1.0, j.lower(*a).compile()(*a)))
    assert not nb07.check_compile_then_run(lambda j, *a: (1.0, 1.0, jnp.zeros((16, 4))))
    assert not nb07.check_compile_then_run(lambda j, *a: (1.0, 1.0))
    capsys.readouterr()

    assert nb07.check_matmul_intensity(sol.my_matmul_intensity)
    assert nb07.check_time_bound(sol.my_time_bound)
    assert nb07.check_compile_then_run(sol.my_compile_then_run)
    assert capsys.readouterr().out.count("PASS") == 3


def test_matmul_intensity_reference():
    assert nb07.matmul_intensity(1, 576, 1536, 4) == pytest.approx(2 * 576 * 1536 / ((576 + 576 * 1536 + 1536) * 4))
    assert nb07.matmul_intensity(1, 576, 1536, 4) < 0.5 < nb07.matmul_intensity(32, 576, 1536, 4)
