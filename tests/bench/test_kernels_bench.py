"""``jaxlab bench --kernels``: every way computes the same attention; targets judged only where kernels compile."""

from __future__ import annotations

import argparse
import io
import json

from jaxlab.bench.kernels import kernel_targets, run_kernels


def test_quick_run_on_a_cpu_checks_every_path_and_claims_no_speed(tmp_path):
    out, path = io.StringIO(), tmp_path / "k.json"
    assert run_kernels(argparse.Namespace(quick=True, json=str(path)), out) == 0
    res = json.loads(path.read_text())
    assert res["interpret"] and len(res["rows"]) == 2 and res["meta"]["cpu"]
    for row in res["rows"]:
        assert row["prefill_max_abs_diff"] < 1e-5 and row["decode_max_abs_diff"] < 1e-5
        assert not row["prefill_pallas_error"] and not row["decode_paged_error"]
    assert out.getvalue().count("NOT MEASURABLE HERE") == 2
    assert "interpret mode (a simulator" in out.getvalue()


def test_gpu_targets_are_judged_from_the_worst_case():
    rows = [
        {"context": 8192, "batch": 1, "prefill_speedup_vs_jnp": 1.4, "decode_paged_over_contiguous": 1.1},
        {"context": 8192, "batch": 32, "prefill_speedup_vs_jnp": 0.9, "decode_paged_over_contiguous": 1.3},
        {"context": 512, "batch": 1, "prefill_speedup_vs_jnp": 0.5, "decode_paged_over_contiguous": 1.0},
    ]
    got = kernel_targets({"interpret": False, "rows": rows})
    assert [(name, met) for name, met, _ in got] == [
        ("prefill kernel >= 1.0x jnp at 8k", False),
        ("paged decode <= 1.2x contiguous", False),
    ]
    rows[1].update(prefill_speedup_vs_jnp=1.0, decode_paged_over_contiguous=1.2)
    assert all(met for _, met, _ in kernel_targets({"interpret": False, "rows": rows}))
