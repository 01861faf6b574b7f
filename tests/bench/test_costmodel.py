"""jaxlab.bench.costmodel: the read-bandwidth ceiling measured by the CPU kernels' threads, and the quantized rows'
percentages of it."""

import jax
import pytest

from jaxlab.bench import costmodel
from jaxlab.engine.kernels import cpu as cpu_kernels


def test_read_bandwidth_is_measured_where_the_kernels_run():
    read = costmodel.measure_read_bandwidth(64 << 20, repeats=2)  # small: caches inflate it; a test, not a ceiling
    if jax.default_backend() == "cpu" and cpu_kernels.status().available:
        assert read is not None and 1e9 < read < 1e13, read
    else:
        assert read is None


def test_quant_rows_get_a_read_roofline_where_the_read_was_measured():
    rows = [{"bytes_per_step": 140e6, "step_s": {"median": 0.014}}]
    costmodel.add_quant_rooflines(
        rows, {"bandwidth_bytes_per_s": 35e9, "read_bandwidth_bytes_per_s": 25e9, "published": None}
    )
    assert rows[0]["read_roofline_pct"] == pytest.approx(100 * 140e6 / 0.014 / 25e9)
    assert rows[0]["bw_roofline_pct"] == pytest.approx(100 * 140e6 / 0.014 / 35e9)
    costmodel.add_quant_rooflines(
        rows, {"bandwidth_bytes_per_s": 35e9, "read_bandwidth_bytes_per_s": None, "published": None}
    )
    assert rows[0]["read_roofline_pct"] is None
