"""Sharded generation equals single-device generation.

Two halves in one file:

* tests on one device, or any number (mesh parsing, rules, padding, error messages, the exercises' checkers);
* tests on 8 devices (named ``test_8dev_*``): every test process has 8 simulated CPU devices
  (``tests/conftest.py``), so they run here, in the same process as the rest.

The tiny config covers every strategy and mesh shape; the real model runs once per strategy and must
reproduce the golden greedy tokens (which the single-device Generator reproduces, test_reference.py).
"""

from __future__ import annotations

from types import SimpleNamespace

import jax
import numpy as np
import pytest
from conftest import load_solution
from jax.sharding import PartitionSpec as P

import jaxlab
from jaxlab.engine import mesh as M
from jaxlab.engine import placement
from jaxlab.engine import sharding as S
from jaxlab.engine.generate import Generator
from jaxlab.engine.kvcache import left_pad
from jaxlab.engine.model import forward, init_params
from jaxlab.errors import ConfigError, InvalidRequestError
from jaxlab.lab import parallel

# 8 rows: at least 2 per device on every mesh below (one row per device makes XLA:CPU compile each step's
# one-row matmuls as reductions: slower to compile, and a shape no mesh needs)
PROMPTS = [
    [1, 5, 7, 9],
    [1, 20, 30],
    [1, 40, 41, 42, 43, 44],
    [1, 8],
    [1, 17, 42, 99, 7],
    [1, 250, 3, 3, 8, 9],
    [1, 64],
    [1, 77, 78],
]


@pytest.fixture(scope="module")
def tiny_params():
    return init_params(jaxlab.tiny(), 0)


@pytest.fixture(scope="module")
def tiny_generator(tiny_params):
    """The single-device Generator of the tiny model: its compiled programs serve every test that runs PROMPTS."""
    return Generator(tiny_params)


@pytest.fixture(scope="module")
def one_device(tiny_params):
    """one_device(strategy): the tiny model on a 1x1 mesh, one Sharded per strategy for the module, so the tests
    that run it share its compiled programs."""
    made = {}

    def get(strategy):
        if strategy not in made:
            made[strategy] = S.shard(tiny_params, "data=1,model=1", strategy)
        return made[strategy]

    return get


@pytest.fixture(scope="module")
def tiny_reference(tiny_generator):
    """Single-device greedy tokens and logits of the tiny model on PROMPTS."""
    tiny_params = tiny_generator.params
    ids = [r.generated_ids for r in tiny_generator.generate(PROMPTS, 10, ignore_eos=True)]
    tokens, positions = left_pad(PROMPTS, 2)
    logits = np.asarray(jax.jit(forward)(tiny_params, tokens, positions)[0])
    return ids, logits


# --------------------------------------------------------------------------------------------------
# One device
# --------------------------------------------------------------------------------------------------


def test_parse_mesh():
    assert M.parse_mesh("data=2,model=4") == {"data": 2, "model": 4}
    assert M.parse_mesh("model=8") == {"data": 1, "model": 8}
    assert M.parse_mesh(" data = 2 ") == {"data": 2, "model": 1}
    assert M.parse_mesh({"data": 4}) == {"data": 4, "model": 1}
    assert M.format_mesh(M.parse_mesh("model=2")) == "data=1,model=2"
    for bad, words in [
        ("pipe=2", "unknown"),
        ("data=x", "whole number"),
        ("data=0", "at least 1"),
        ("data", "name=size"),
        ("data=2,data=2", "twice"),
    ]:
        with pytest.raises(ConfigError, match=words):
            M.parse_mesh(bad)


def test_fit_mesh_uses_the_devices_there_are():
    assert M.fit_mesh("data+tensor", 8) == {"data": 2, "model": 4}
    assert M.fit_mesh("data+tensor", 4) == {"data": 2, "model": 2}
    assert M.fit_mesh("data+tensor", 6) == {"data": 2, "model": 3}
    assert M.fit_mesh("data+tensor", 1) == {"data": 1, "model": 1}
    assert M.fit_mesh("data", 4) == {"data": 4, "model": 1}
    assert M.fit_mesh("tensor", 4) == {"data": 1, "model": 4}
    n = jax.device_count()
    assert M.fit_mesh("data") == {"data": n, "model": 1}


def test_too_big_a_mesh_says_how_to_get_more_devices():
    n = jax.device_count()
    with pytest.raises(ConfigError) as e:
        M.make_mesh({"data": 2 * n, "model": 2})
    msg = str(e.value)
    assert f"needs {4 * n} devices" in msg and f"jax sees {n}" in msg
    assert "XLA_FLAGS=--xla_force_host_platform_device_count" in msg


def test_describe_mesh():
    line = M.describe_mesh()
    assert f"{jax.device_count()} cpu device" in line and "mesh data=" in line
    assert "needs 64 devices" in M.describe_mesh("data=8,model=8")


def _fake_devices(platform, n, kind=None):
    return [SimpleNamespace(platform=platform, device_kind=kind or platform, id=i) for i in range(n)]


def test_mesh_devices_uses_enough_accelerators_else_simulated_cpu_devices():
    cpu8 = _fake_devices("cpu", 8)
    # a free Colab TPU: one v5e chip -> the meshes are built from the host's 8 simulated CPU devices, and it says so
    one_tpu = M.mesh_devices(4, _fake_devices("tpu", 1, "TPU v5 lite"), cpu8)
    assert one_tpu.devices == tuple(cpu8) and one_tpu.platform == "cpu" and one_tpu.simulated
    assert "1 TPU v5 lite device" in one_tpu.note and "8 simulated CPU devices" in one_tpu.note
    assert "Kaggle TPU v5e-8" in one_tpu.note and one_tpu.measurable(2)
    # a v5e-8 (Kaggle, TPU VM): the real chips
    eight = M.mesh_devices(4, _fake_devices("tpu", 8, "TPU v5 lite"), cpu8)
    assert eight.count == 8 and eight.platform == "tpu" and not eight.simulated
    # one GPU, and the flag was not set before jax started: one device, and claims needing more are not measurable
    lonely = M.mesh_devices(4, _fake_devices("gpu", 1, "Tesla T4"), _fake_devices("cpu", 1))
    assert lonely.count == 1 and lonely.platform == "gpu" and not lonely.measurable(2)
    assert "not measurable" in lonely.note
    # on a CPU: the CPU devices there are (simulated when more than one)
    here = M.mesh_devices(4, cpu8)
    assert here.count == 8 and here.simulated and here.note.startswith("Meshes use the 8 simulated CPU devices")
    assert "XLA_FLAGS" in M.mesh_devices(4, _fake_devices("cpu", 1)).note
    assert M.mesh_devices().count == jax.device_count()


def test_shard_and_describe_mesh_take_a_device_list(tiny_params):
    devs = jax.devices()[:1]
    assert M.describe_mesh(devices=devs).startswith("1 cpu device")
    assert S.shard(tiny_params, None, "tensor", devices=devs).shape == {"data": 1, "model": 1}


def test_rules_are_a_mapping_and_specs_follow_them():
    assert M.rules_for("data") == {"batch": "data"}
    assert M.rules_for("tensor") == {"q_heads": "model", "kv_heads": "model", "mlp": "model"}
    assert M.rules_for("data", {"vocab": "model"}) == {"batch": "data", "vocab": "model"}
    assert M.rules_for("tensor", {"mlp": None}) == {"q_heads": "model", "kv_heads": "model"}
    with pytest.raises(ConfigError, match="unknown strategy"):
        M.rules_for("pipeline")
    with pytest.raises(ConfigError, match="mesh axes"):
        M.rules_for("data", {"batch": "rows"})
    tp = M.rules_for("tensor")
    assert M.logical_to_spec(("embed", "q_heads"), tp) == P(None, "model")
    assert M.logical_to_spec(("q_heads", "embed"), tp) == P("model")
    cache_k = ("batch", "kv_heads", "cache_len", "head_dim")
    assert M.logical_to_spec(cache_k, M.rules_for("data+tensor")) == P("data", "model")
    assert M.logical_to_spec(("q_heads", "kv_heads"), tp) == P("model")  # a mesh axis is used once


def test_every_parameter_has_logical_axes(tiny_params):
    specs = placement.param_specs(tiny_params, M.rules_for("data+tensor"))
    assert specs["embed"] == P() and specs["norm.weight"] == P()
    assert specs["layers.1.attn.wq"] == P(None, "model") and specs["layers.1.attn.wo"] == P("model")
    assert specs["layers.2.mlp.w_up"] == P(None, "model") and specs["layers.2.mlp.w_down"] == P("model")
    assert set(placement.param_specs(tiny_params, M.rules_for("data")).values()) == {P()}
    with pytest.raises(ConfigError, match="no logical axes"):
        M.param_logical_axes("layers.0.attn.w_mystery")


def test_divisibility_error_names_the_constraint():
    mesh = SimpleNamespace(shape={"data": 2, "model": 4})
    with pytest.raises(ConfigError, match=r"size 263.*model=4 does not divide"):
        M.check_divisible((263, 40), P("model"), mesh, "parameter embed (263, 40)")
    M.check_divisible((264, 40), P("model"), mesh, "fine")


@pytest.mark.parametrize("model", [2, 3, 4, 8])
def test_padding_heads_keeps_the_function(tiny_params, tiny_reference, model):
    padded = placement.pad_heads(tiny_params, model)
    cfg, pcfg = tiny_params.config, padded.config
    assert pcfg.n_kv_heads % model == 0 and pcfg.n_heads % model == 0 and pcfg.ffn_dim % model == 0
    assert pcfg.q_per_kv == cfg.q_per_kv
    tokens, positions = left_pad(PROMPTS, 2)
    logits = np.asarray(jax.jit(forward)(padded, tokens, positions)[0])
    np.testing.assert_allclose(logits, tiny_reference[1], atol=1e-5, rtol=1e-5)
    assert placement.pad_heads(tiny_params, 1) is tiny_params


@pytest.mark.parametrize("fmt", ["int8", "int4"])
def test_padding_quantized_heads_keeps_the_function(tiny_params, fmt):
    from jaxlab.quant import QuantizedMatrix, quantize_params

    params = quantize_params(tiny_params, fmt, group=4)
    padded = placement.pad_heads(params, 4)  # 2 -> 4 KV heads, zero weights in each format's own codes
    assert padded.quant == fmt and isinstance(padded.flat()["layers.0.attn.wo"], QuantizedMatrix)
    tokens, positions = left_pad(PROMPTS, 2)
    want = jax.jit(forward)(params, tokens, positions)[0]
    tol = 1e-4 if fmt == "int4" else 1e-5  # int4 sums per group: the padded groups change the summation order
    np.testing.assert_allclose(jax.jit(forward)(padded, tokens, positions)[0], want, atol=tol, rtol=tol)
    if fmt == "int4":  # padded inputs must be whole groups
        with pytest.raises(ConfigError, match="whole int4 groups"):
            placement.pad_kernel(params.flat()["layers.0.attn.wo"], 6, 0, "wo")


def test_sharding_math_also_runs_on_one_device(one_device, tiny_reference):
    """A 1x1 mesh runs every strategy's code path (and is what a 1-device Colab runtime gets)."""
    for strategy, prefill in (("data", True), ("tensor", False), ("shard_map", True), ("pmap", False)):
        sm = one_device(strategy)
        assert sm.generate(PROMPTS, 10, ignore_eos=True, prefill=prefill) == tiny_reference[0], strategy
        np.testing.assert_allclose(sm.prompt_logits(), tiny_reference[1][:, -1], atol=1e-5, rtol=1e-5)


def test_generate_validates_requests(tiny_params, one_device):
    sm = one_device("data")  # "data=1": the same 1x1 mesh
    with pytest.raises(InvalidRequestError):
        sm.generate([[]], 4)
    with pytest.raises(InvalidRequestError, match="vocabulary"):
        sm.generate([[1, 10_000]], 4)
    with pytest.raises(InvalidRequestError):
        sm.generate([[1, 2]], 0)
    with pytest.raises(ConfigError, match="unknown strategy"):
        S.shard(tiny_params, "data=1", "pipeline")


def test_results_stream_and_stop_like_the_generator(tiny_params, tiny_generator, one_device, tiny_reference, smollm):
    """The host side is the Generator's (TextStops): the same texts, stop strings, streamed pieces, logprobs."""
    tok = smollm.tokenizer  # any tokenizer decodes the tiny model's ids (< 263) to some text
    text = tok.decode(tiny_reference[0][0])
    stop = [text[len(text) // 2 : len(text) // 2 + 2]]
    runs = {}
    single = Generator(tiny_params, tok)
    single.programs = tiny_generator.programs  # the same model and shapes: its compiled programs
    for name, gen in [("one device", single), ("mesh", one_device("data"))]:
        pieces = []
        kwargs = dict(ignore_eos=True, stop=stop, logprobs=True, on_text=lambda i, piece: pieces.append((i, piece)))
        if name == "mesh":
            results = gen.generate_results(PROMPTS, 10, tokenizer=tok, **kwargs)
        else:
            results = gen.generate(PROMPTS, 10, **kwargs)
        runs[name] = [(r.generated_ids, r.text, r.finish_reason) for r in results], pieces, results
    assert runs["mesh"][:2] == runs["one device"][:2]
    assert runs["mesh"][0][0][2] == "stop"
    got, want = ([r.logprobs for r in runs[k][2]] for k in ("mesh", "one device"))
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, atol=1e-5)


def test_eos_ends_a_row_like_the_generator(tiny_params, tiny_generator):
    # a config whose EOS is the token the tiny model emits first for prompt 0 ends that row at once
    first = tiny_generator.generate([PROMPTS[0]], 1, ignore_eos=True)[0].generated_ids[0]
    params = jaxlab.engine.model.replace_config(tiny_params, eos_id=first)
    want = [r.generated_ids for r in Generator(params).generate(PROMPTS, 6)]
    assert S.shard(params, "data=1", "data").generate(PROMPTS, 6) == want
    assert want[0] == []


# -- the exercises' checkers -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def solution():
    return load_solution("08_parallelism")


def test_exercise_partition_spec(solution, capsys):
    from jaxlab.lab.exercises import nb08

    assert nb08.check_partition_spec(solution.my_partition_spec)
    assert not nb08.check_partition_spec(lambda axes, rules: P(*axes))
    assert not nb08.check_partition_spec(lambda axes, rules: P(*(rules.get(a, "model") for a in axes)))

    def stub(axes, rules):
        raise NotImplementedError

    assert not nb08.check_partition_spec(stub)
    out = capsys.readouterr().out
    assert "PASS" in out and "FAIL: logical axes -> PartitionSpec: not implemented yet" in out


def test_exercise_tp_mlp(solution, capsys):
    from jaxlab.lab.exercises import nb08

    assert nb08.check_tp_mlp_partials(solution.my_tp_mlp_partials)

    def whole_mlp_on_every_device(x, g, u, d, n):  # the sum, not the partials: a classic mistake
        y = sum(nb08.tp_mlp_partials(x, g, u, d, n))
        return np.stack([y] * n)

    assert not nb08.check_tp_mlp_partials(whole_mlp_on_every_device)
    # and the partials do add up to the whole MLP (the all-reduce)
    rng = np.random.default_rng(0)
    x, g, u, d = rng.normal(size=(2, 5)), rng.normal(size=(5, 8)), rng.normal(size=(5, 8)), rng.normal(size=(8, 5))
    silu = lambda z: z / (1 + np.exp(-z))  # noqa: E731
    np.testing.assert_allclose(solution.my_tp_mlp_partials(x, g, u, d, 4).sum(0), (silu(x @ g) * (x @ u)) @ d)
    assert "FAIL: tensor-parallel MLP partial sums" in capsys.readouterr().out


def test_exercise_pad_heads(solution, tiny_params, capsys):
    from jaxlab.lab.exercises import nb08

    assert nb08.check_pad_heads(solution.my_pad_heads)

    def pads_q_heads_only(wq, wk, wv, wo, h, kvh, hd, model):  # forgets the KV heads
        e = (-(-h // model) * model - h) * hd
        return np.pad(wq, ((0, 0), (0, e))), wk, wv, np.pad(wo, ((0, e), (0, 0)))

    assert not nb08.check_pad_heads(pads_q_heads_only)
    assert "FAIL: pad attention heads" in capsys.readouterr().out
    # the checker's reference agrees with the module's pad_heads on a real layer
    cfg, flat = tiny_params.config, tiny_params.flat()
    padded = placement.pad_heads(tiny_params, 4).flat()
    ref = nb08.pad_attention(
        *(np.asarray(flat[f"layers.0.attn.{w}"]) for w in ("wq", "wk", "wv", "wo")),
        cfg.n_heads,
        cfg.n_kv_heads,
        cfg.head_dim,
        4,
    )
    for w, r in zip(("wq", "wk", "wv", "wo"), ref):
        np.testing.assert_array_equal(np.asarray(padded[f"layers.0.attn.{w}"]), r)


def test_the_tests_have_eight_devices():
    """What the ``test_8dev_*`` tests stand on (tests/conftest.py): without it they would fail on mesh sizes."""
    assert jax.device_count() == 8 and jax.devices()[0].platform == "cpu"


# --------------------------------------------------------------------------------------------------
# Eight devices
# --------------------------------------------------------------------------------------------------

# Every strategy with prefill and decode: rows only, heads only (padded 2 -> 8 KV heads), both (padded 2 -> 4).
# Meshes are shared with the tests below, which reuse the compiled programs. shard_map runs below: on model=8
# (the prompt through its decode step, the full logits), on data=2,model=2 (int8 weights and cache) and, with
# prefill and decode on data=2,model=4, with the real model.
TINY_CASES = [
    ("data", "data=4"),
    ("tensor", "model=8"),
    ("data+tensor", "data=2,model=4"),
    ("pmap", "data=4"),
]
FITTED = {
    "data": "data=8",
    "tensor": "model=8",
    "data+tensor": "data=2,model=4",
    "shard_map": "model=8",
    "pmap": "data=8",
}


@pytest.fixture(scope="module")
def placed(tiny_params):
    """placed(strategy, mesh): the tiny model on that mesh, one Sharded per (strategy, mesh) for the whole
    module, so tests that run the same shapes share its compiled programs (mesh None: the fitted one)."""
    made = {}

    def get(strategy, mesh=None):
        key = (strategy, mesh or FITTED[strategy])
        if key not in made:
            made[key] = S.shard(tiny_params, key[1], strategy)
        return made[key]

    return get


@pytest.mark.parametrize("strategy,mesh", TINY_CASES, ids=[f"{s}-{m}" for s, m in TINY_CASES])
def test_8dev_tiny_tokens_and_logits_equal_single_device(placed, tiny_reference, strategy, mesh):
    sm = placed(strategy, mesh)
    ids, logits = tiny_reference
    assert sm.generate(PROMPTS, 10, ignore_eos=True) == ids
    np.testing.assert_allclose(sm.prompt_logits(), logits[:, -1], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("strategy,mesh", [("tensor", "model=8"), ("shard_map", "model=8"), ("pmap", "data=4")])
def test_8dev_full_logits_equal_single_device(placed, tiny_reference, strategy, mesh):
    sm = placed(strategy, mesh)
    tokens, positions = left_pad(PROMPTS, 2)
    np.testing.assert_allclose(sm.logits(tokens, positions), tiny_reference[1], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(
    "strategy,mesh", [("data+tensor", "data=2,model=4"), ("shard_map", "model=8"), ("pmap", "data=4")]
)
def test_8dev_prompt_through_the_decode_step_gives_the_same_tokens(placed, tiny_reference, strategy, mesh):
    sm = placed(strategy, mesh)  # the decode program of the same shapes as above: no compile
    assert sm.generate(PROMPTS, 10, ignore_eos=True, prefill=False) == tiny_reference[0]
    np.testing.assert_allclose(sm.prompt_logits(), tiny_reference[1][:, -1], atol=1e-5, rtol=1e-5)


def test_8dev_batch_is_padded_to_the_data_axis(placed, tiny_reference):
    sm = placed("data", "data=4")
    assert sm.generate(PROMPTS[:7], 10, ignore_eos=True) == tiny_reference[0][:7]  # 7 rows + a copy of the first
    with pytest.raises(InvalidRequestError, match="multiple of 4"):
        sm.logits(*left_pad(PROMPTS[:7], 2))


def test_8dev_fitted_meshes_use_all_devices(placed, tiny_params):
    for strategy in FITTED:
        assert placed(strategy).mesh.size == 8, strategy
        assert M.fit_mesh(strategy) == M.parse_mesh(FITTED[strategy]), strategy
    assert S.shard(tiny_params, None).strategy == "data+tensor"


def test_8dev_parameter_and_cache_shardings_are_what_the_rules_say(placed):
    sm = placed("data+tensor", "data=2,model=4")
    cfg = sm.config  # padded: 2 -> 4 KV heads, 6 -> 12 query heads, 84 MLP units stay 84
    assert (cfg.n_kv_heads, cfg.n_heads, cfg.ffn_dim) == (4, 12, 84)
    for name, a in sm.params.flat().items():
        assert a.sharding.spec == M.logical_to_spec(M.param_logical_axes(name), sm.rules, sm.mesh), name
    flat = sm.params.flat()
    wq = flat["layers.0.attn.wq"]  # [D, H*Hd] split by columns: 3 query heads (one group) per device
    assert wq.addressable_shards[0].data.shape == (cfg.dim, cfg.n_heads * cfg.head_dim // 4)
    assert flat["layers.0.attn.wo"].addressable_shards[0].data.shape == (cfg.n_heads * cfg.head_dim // 4, cfg.dim)
    assert flat["layers.0.mlp.w_down"].addressable_shards[0].data.shape == (cfg.ffn_dim // 4, cfg.dim)
    assert flat["embed"].sharding.is_fully_replicated
    cache = sm.cache_shardings(batch=4, cache_len=16)
    assert cache.k[0].spec == P("data", "model") and cache.v[0].spec == P("data", "model")
    assert cache.pos.spec == P("data") and cache.index.is_fully_replicated
    # device (d, m) holds rows 2d..2d+1 and KV head m of every layer's K
    k = sm.init_cache(4, 16).k[0]
    for shard in k.addressable_shards:
        assert shard.data.shape == (2, 1, 16, cfg.head_dim)
    assert placed("tensor", "model=8").cache_shardings(2, 16).k[0].spec == P(None, "model")
    dp = placed("data", "data=8")
    assert dp.cache_shardings(8, 16).k[0].spec == P("data")
    assert dp.params.flat()["layers.0.attn.wq"].sharding.is_fully_replicated


def test_8dev_collectives_in_the_compiled_decode_step(placed, tiny_params):
    layers, dim = tiny_params.config.n_layers, tiny_params.config.dim
    want = {"data": 0, "pmap": 0, "tensor": 2 * layers, "data+tensor": 2 * layers, "shard_map": 2 * layers}
    infos = {}
    for strategy, n in want.items():
        sm = placed(strategy, dict(TINY_CASES, shard_map="model=8")[strategy])
        infos[strategy] = info = parallel.decode_step_info(sm, batch=8)  # the program generate ran for 8 rows
        assert info.collectives["all-reduce"] == n, (strategy, info.collectives)
        assert info.total_collectives == n, (strategy, info.collectives)
        before = sm.compile_seconds
        assert parallel.decode_step_info(sm, batch=8).hlo == info.hlo
        assert sm.compile_seconds == before  # the same program, not compiled again
    # two all-reduces per layer, each of the activations [rows per device, 1, D] in float32
    assert infos["data+tensor"].bytes["all-reduce"] == 2 * layers * (8 // 2) * dim * 4  # data=2, model=4
    assert infos["tensor"].bytes["all-reduce"] == 2 * layers * 8 * dim * 4


def test_8dev_a_rule_that_cannot_work_names_the_constraint(tiny_params):
    with pytest.raises(ConfigError, match=r"parameter embed \(263, 40\).*size 263.*model=2"):
        S.shard(tiny_params, "model=2", "tensor", rules={"vocab": "model"})
    with pytest.raises(ConfigError, match="needs 16 devices"):
        M.make_mesh("data=4,model=4")
    with pytest.raises(ConfigError, match="pmap maps over one axis"):
        S.shard(tiny_params, "data=2,model=2", "pmap")
    with pytest.raises(ConfigError, match="rule overrides apply to the jit strategies"):
        S.shard(tiny_params, "model=2", "shard_map", rules={"vocab": "model"})


def test_8dev_vocab_split_is_one_rule_away(tiny_params, tiny_reference):
    # 263 is prime: one zero row makes the vocabulary 264 = 8 x 33 (its logit is cut off below)
    flat = {k: (np.pad(np.asarray(v), ((0, 1), (0, 0))) if k == "embed" else v) for k, v in tiny_params.flat().items()}
    params = jaxlab.engine.model.params_from_flat(tiny_params.config.replace(vocab_size=264), flat, tiny_params.policy)
    sm = S.shard(params, "model=8", "tensor", rules={"vocab": "model"})
    assert sm.params.flat()["embed"].sharding.spec == P("model")
    tokens, positions = left_pad(PROMPTS, 2)
    np.testing.assert_allclose(sm.logits(tokens, positions)[..., :263], tiny_reference[1], atol=1e-5, rtol=1e-5)


# -- quantized parameters and the int8 KV cache, through forward's psum hook ---------------------------------


def test_8dev_quantized_weights_and_int8_cache_under_shard_map(tiny_params):
    """int8 weights and the int8 KV cache, rows over data and heads over model: the single-device tokens,
    and the log-probability of every chosen token within 1e-4. (Not 1e-5: a row-parallel int8 matmul writes
    its activations as two int8 rows (quant.split_activations, ~15 bits) with a per-row scale taken over
    the device's slice of the row, not the whole row.)"""
    from jaxlab.quant import quantize_params

    params = quantize_params(tiny_params, "int8")
    want = Generator(params, cache_dtype="int8").generate(PROMPTS, 10, ignore_eos=True, logprobs=True)
    sm = S.shard(params, "data=2,model=2", "shard_map", cache_dtype="int8")
    got = sm.generate_results(PROMPTS, 10, ignore_eos=True, logprobs=True)
    assert [r.generated_ids for r in got] == [r.generated_ids for r in want]
    np.testing.assert_allclose([r.logprobs for r in got], [r.logprobs for r in want], atol=1e-4, rtol=1e-4)
    scale_spec = M.logical_to_spec(M.CACHE_AXES["k_scale"], sm.rules, sm.mesh)  # [B, KVH, S]: rows and heads split
    assert sm.cache_shardings(4, 16).k_scale[0].spec == scale_spec == P("data", "model")


# -- the real model ---------------------------------------------------------------------------------------

# The two ways of splitting heads, on the 2-D mesh (rows over data, SmolLM2's 3 KV heads padded to 4): ours
# (shard_map, forward's psum hook) generates the golden tokens; the partitioner's (jit + NamedSharding)
# gives the golden logits in one forward pass. The other strategies differ from data+tensor only in their
# rules (data, tensor) or run the single-device program on each device (pmap): the tiny cases check each.
REAL_MESH = "data=2,model=4"
REAL_NEW = 4  # the prompt plus 3 decode steps through the sharded cache


@pytest.fixture(scope="module")
def golden_rows():
    from jaxlab.tools.reference import load_golden

    # 4 rows: 2 per device on data=2. (With one row per device, XLA:CPU compiles the decode step's
    # one-row matmuls as reductions, which takes 2.5x longer: 3.4 s instead of 1.3 s for SmolLM2.)
    return load_golden()["prompts"][:4]


@pytest.fixture(scope="module")
def real_placed(smollm):
    """The real model padded and placed on data=2,model=4 once: both strategies there use the same rules."""
    return S.shard(smollm.params, REAL_MESH, "shard_map").params


def check_golden_logits(rows, logits):
    from jaxlab.tools.reference import compare_logits

    for row, r in zip(logits, rows):
        ok, line = compare_logits(row, r["last_logits"])
        assert ok, line


def test_8dev_real_model_shard_map_reproduces_the_golden_tokens_and_logits(smollm, real_placed, golden_rows):
    """Greedy tokens equal the golden ones (which the single-device Generator reproduces), and the
    prompt logits are within float32 tolerance of the reference's."""
    sm = S.shard(real_placed, REAL_MESH, "shard_map")  # already padded and in place: nothing moves
    assert (sm.config.n_kv_heads, sm.config.n_heads) == (4, 12)  # 3 -> 4 KV heads, 9 -> 12 query heads
    assert placement.padded_sizes(smollm.config, 8) == {"n_heads": 24, "n_kv_heads": 8, "ffn_dim": 1536}
    got = sm.generate([r["prompt_ids"] for r in golden_rows], REAL_NEW, ignore_eos=True)
    assert got == [r["greedy_ids"][:REAL_NEW] for r in golden_rows]
    check_golden_logits(golden_rows, sm.prompt_logits())


def test_8dev_real_model_jit_data_tensor_gives_the_golden_logits(real_placed, golden_rows):
    sm = S.shard(real_placed, REAL_MESH, "data+tensor")
    tokens, positions = left_pad([r["prompt_ids"] for r in golden_rows], sm.config.pad_id)
    last = sm.logits(tokens, positions)[:, -1]
    assert last.argmax(-1).tolist() == [r["greedy_ids"][0] for r in golden_rows]
    check_golden_logits(golden_rows, last)
