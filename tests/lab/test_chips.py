"""Notebook 16's helpers (the compiling itself is tested in tests/bench/test_chip_compile.py): the scaling formulas,
reading layouts and refusals, and the exercises' checkers, which accept the solutions and fail wrong answers."""

from __future__ import annotations

import jax.numpy as jnp
import pytest
from conftest import load_solution, not_implemented

from jaxlab.bench import chip_compile as cc
from jaxlab.engine.kvcache import init_cache
from jaxlab.io.config import smollm2_135m
from jaxlab.lab import chips
from jaxlab.lab.exercises import nb16


def test_scaling_formulas():
    cfg = smollm2_135m()
    assert chips.kv_bytes(cfg, 1, 1) == 2 * 30 * 3 * 64 * 2 == 23_040
    assert chips.kv_bytes(cfg, 2, 16, jnp.float32) == init_cache(cfg, 2, 16).nbytes()
    assert chips.ridge() == pytest.approx(197e12 / 819e9)
    assert chips.critical_batch() == pytest.approx(chips.ridge())  # bfloat16: 2 FLOPs over 2 bytes per parameter
    assert chips.critical_batch(bytes_per_param=1) == pytest.approx(chips.ridge() / 2)  # int8 weights: half the batch
    assert chips.max_intensity(cfg, 1024) == pytest.approx(2 * cfg.n_params() / (23_040 * 1024))
    assert chips.decode_floor_s(819e9, 0) == pytest.approx(1.0)


def test_layouts_and_refusals_are_read_from_the_compilers_text():
    hlo = (
        "HloModule m\n\n%fused (p: bf16[8]) -> bf16[8] {\n  %p = bf16[8]{0} parameter(0)\n}\n\n"
        "ENTRY %main (a: bf16[576,192], b: s32[8]) -> bf16[8] {\n"
        "  %a = bf16[576,192]{0,1:T(8,128)(2,1)} parameter(0), sharding={replicated}\n"
        "  %b = s32[8]{0:T(128)} parameter(1)\n  %c = bf16[8]{0} add(%a, %b)\n}\n"
    )
    assert chips.parameter_layouts(hlo) == ["bf16[576,192]{0,1:T(8,128)(2,1)}", "s32[8]{0:T(128)}"]
    msg = "RESOURCE_EXHAUSTED: Ran out of memory on HBM, the total memory required for HLO temporaries (19.00G) exceeds available HBM (15.75G)."
    assert chips.required_bytes(msg) == 19 * 2**30 and chips.required_bytes("something else") is None


def test_the_exercise_checkers_accept_the_solutions_and_fail_wrong_answers(capsys):
    sol = load_solution("16_tpu_from_cpu")
    assert nb16.check_kv_bytes(sol.my_kv_bytes) and nb16.check_max_batch(sol.my_max_batch)
    assert not nb16.check_kv_bytes(lambda L, h, d, b, c, i: L * h * d * b * c * i)  # forgot V
    assert not nb16.check_max_batch(lambda w, kv, hbm, reserve=0.1: max(0, int((hbm - w) // kv)))  # no reserve
    assert not nb16.check_max_batch(lambda w, kv, hbm, reserve=0.1: int((hbm * (1 - reserve) - w) // kv))  # < 0
    assert not nb16.check_kv_bytes(not_implemented)
    assert "not implemented yet" in capsys.readouterr().out


def test_decode_reports_answer_in_the_order_asked_whatever_order_they_compile_in(monkeypatch):
    # the largest model starts compiling first (the longest compile must not start last); the reports come back
    # in the order of the cases, each its own (the compiler is replaced: what it returns is the case's layer count)
    cfg = smollm2_135m()
    monkeypatch.setattr(cc, "compile_all", lambda s, chip, only, workers: s.config.n_layers)
    cases = {name: cc.Settings(cfg.replace(n_layers=n)) for name, n in (("small", 2), ("whole", 30), ("mid", 9))}
    assert list(chips.decode_reports(cases).items()) == [("small", 2), ("whole", 30), ("mid", 9)]
