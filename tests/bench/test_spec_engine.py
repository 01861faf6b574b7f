"""The speculative-engine measurement's wiring, on the tiny model (the real run: ``python -m jaxlab.bench.spec_engine``,
its figures in benchmarks/README.md)."""

from __future__ import annotations

from conftest import byte_tokenizer

from jaxlab.bench.spec_engine import measure_engine, render_engine
from jaxlab.engine.model import init_params
from jaxlab.io.config import tiny


def test_the_engine_measurement_compares_three_roads_on_identical_tokens():
    prompts = [[1] + [5, 6, 7, 8] * 5, [1, 9, 10, 11, 9, 10, 11], [1, 44, 45]]
    res = measure_engine(
        init_params(tiny(), 7), byte_tokenizer(), prompts, k=2, max_new_tokens=8, repeats=1, context=32
    )
    plain, spec, lockstep = res["rows"]
    assert plain["tokens/call"] == 1.0 and plain["identical"] == "yes"
    assert spec["identical"] == "yes" and spec["tokens/call"] > 1.0 and 0 < spec["acceptance"] <= 1
    assert lockstep["identical"] == "yes" and lockstep["seconds"] is None
    assert res["speed_up"] > 0 and res["host"]["cpu"] and res["batch"] == 3
    text = render_engine(res)
    assert "speculative engine / plain engine" in text and res["host"]["cpu"] in text
