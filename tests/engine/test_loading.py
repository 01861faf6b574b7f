"""The model options every face shares (``jaxlab.engine.loading.ModelOptions``): each flag rule raises one
InvalidRequestError naming the flag to drop, when the options are built, before anything loads (no model here).
The same rules seen from the shell: tests/test_cli.py (``test_quant_flags_that_cannot_work``,
``test_bad_input_one_line``)."""

from __future__ import annotations

import pytest

from jaxlab.engine.loading import ModelOptions, resolve_dtype
from jaxlab.errors import ConfigError, InvalidRequestError
from jaxlab.quant import DEFAULT_GROUP


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(dtype="float8"), "unknown --dtype 'float8'; choose one of auto, bfloat16"),
        (dict(quant="int3"), "unknown --quant 'int3'"),
        (dict(kv_cache="int4"), "unknown --kv-cache 'int4'"),
        (dict(attention="triton"), "unknown --attention 'triton'"),
        (dict(quant="int8", group_size=64), "--group-size applies to --quant int4 only; drop --group-size"),
        (dict(group_size=64), "(got --quant (none))"),
        (dict(quant="int8", dtype="bfloat16"), "--quant int8 computes in float32; drop --dtype bfloat16"),
        (
            dict(quant="int8", mesh="data=1"),
            "--mesh shards float parameters with a KV cache of their dtype; drop --quant",
        ),
        (dict(kv_cache="int8", mesh="data=1"), "drop --kv-cache int8"),
        (dict(quant="w8a8", kv_cache="int8", mesh="data=1"), "drop --quant and --kv-cache int8"),
        (dict(attention="pallas", kv_cache="int8"), "--attention pallas runs on one device with a float KV cache"),
        (dict(attention="pallas", mesh="data=1"), "drop --kv-cache int8 and --mesh"),
        (dict(speculative="ngram", kv_cache="int8"), "only with a float KV cache; drop --kv-cache int8"),
        (dict(speculative="draft", dtype="bfloat16", kv_cache="float32"), "(bfloat16); drop --kv-cache float32"),
        (dict(speculative="ngram", mesh="data=1"), "--mesh and --speculative cannot be combined"),
        (dict(speculative="draft", draft_k=0), "--draft-k must be >= 1, got 0"),
        (dict(adapter="somewhere", quant="int4"), "--adapter with --quant is not supported"),
    ],
)
def test_rules_name_the_flag(kwargs, match):
    with pytest.raises(InvalidRequestError) as e:
        ModelOptions(**kwargs)
    assert match in str(e.value)


def test_int4_group_size_checked_before_loading():
    with pytest.raises(ConfigError, match="int4 group size must be an even integer >= 2, got 7"):
        ModelOptions(quant="int4", group_size=7)


def test_combinations_that_work():
    """A KV cache of the parameters' own dtype is no change: a mesh or speculative decoding accept it."""
    ModelOptions(dtype="float32", kv_cache="float32", mesh="data=1")
    ModelOptions(dtype="float32", kv_cache="float32", speculative="ngram")
    ModelOptions(quant="int8", kv_cache="int8")
    ModelOptions(attention="pallas", speculative="draft", draft_k=1)
    ModelOptions(draft_k=0)  # --draft-k counts only with --speculative


def test_resolved_values():
    o = ModelOptions()
    assert o.group == DEFAULT_GROUP and ModelOptions(quant="int4", group_size=32).group == 32
    assert o.param_dtype == resolve_dtype("auto") and o.cache_dtype.name == o.param_dtype
    q = ModelOptions(quant="int8")
    assert q.param_dtype == "float32"  # a quantized model computes in float32 on every backend
    assert ModelOptions(quant="int8", kv_cache="int8").cache_dtype.name == "int8"
    assert ModelOptions(dtype="float32").dtype_note() is None  # said only for --dtype auto with --quant
    note = q.dtype_note()
    assert note is None if q.param_dtype == resolve_dtype("auto") else "not this backend's default" in note


def test_replace_checks_again():
    o = ModelOptions(kv_cache="int8")
    assert o.replace(kv_cache=None).kv_cache is None
    with pytest.raises(InvalidRequestError, match="--mesh"):
        o.replace(mesh="data=1")
