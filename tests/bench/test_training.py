"""`jaxlab bench --train`'s arithmetic: model FLOPs of a step, and the report's rows."""

from jaxlab.bench.training import render_training, training_flops
from jaxlab.io.config import tiny


def test_training_flops_count_layers_attention_and_head_by_hand():
    cfg = tiny()  # dim 40, 3 layers, 6 heads, 2 kv heads, head_dim 10, ffn 84, vocab 263
    per_layer = 40 * 10 * (2 * 6 + 2 * 2) + 3 * 40 * 84
    t = 10
    forward = 2 * 3 * per_layer * t + 2 * 2 * 3 * (t * t / 2) * 6 * 10 + 2 * 263 * 40 * 4
    assert training_flops(cfg, [t], 4, "lora") == 2 * forward
    assert training_flops(cfg, [t], 4, "full") == 3 * forward
    assert training_flops(cfg, [t, t], 8, "full") == 2 * training_flops(cfg, [t], 4, "full")


def test_report_has_a_row_per_variant_and_the_remat_trade():
    row = dict(trained_params=10, seconds_per_step=2.0, tokens_per_s=50.0, model_flops_per_s=4e9,
               mfu_vs_measured_ceiling=0.4, temp_bytes=2e9)  # fmt: skip
    res = {"matmul_ceiling_flops": 1e10, "rows": [dict(row, variant="full"), dict(row, variant="full + remat")],
           "remat_trade": {"full": {"memory_ratio": 0.5, "time_ratio": 1.3}}}  # fmt: skip
    text = render_training(res)
    assert "10.0 GFLOP/s" in text and text.count("2000") == 2 and "0.50x the temporary memory for 1.30x" in text


def test_rates_are_total_work_over_total_time():
    from jaxlab.bench.training import step_rates

    r = step_rates([1.0, 3.0, 2.0], [100, 500, 300], [1e9, 5e9, 3e9], ceiling=1e10)
    assert r["seconds_per_step"] == 2.0  # the median step
    assert r["tokens_per_s"] == 900 / 6 and r["model_flops_per_s"] == 9e9 / 6  # not the median step's 300 / 2
    assert r["mfu_vs_measured_ceiling"] == 9e9 / 6 / 1e10
