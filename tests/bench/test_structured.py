"""`jaxlab bench --structured`'s wiring on the small model (two layers): the quality rows with and without the
schema, the step cost at two rows, the targets and the report."""

from __future__ import annotations

from jaxlab.bench.structured import quality, render_structured, step_cost, structured_targets
from jaxlab.io.assets import data_file
from jaxlab.train.data import read_jsonl


def test_rows_cost_targets_and_report(small_model):
    items = read_jsonl(data_file("finetune", "test.jsonl"))[:2]
    params, tok = small_model.params, small_model.tokenizer
    rows = quality(params, tok, items, "small", lambda _: None, slots=2, max_new_tokens=24)
    assert [r["schema"] for r in rows] == [False, True]
    for r in rows:
        assert r["n"] == 2 and 0 <= r["schema_valid"] <= 1 and 0 <= r["field_exact"] <= 1 and r["tokens"] > 0
    cost = step_cost(params, tok, items, 2, lambda _: None, new_tokens=24)
    assert cost["free"]["steps"] >= 3 and cost["schema"]["grammar_s"] > 0 and cost["free"]["grammar_s"] == 0
    assert cost["ratio"] == cost["schema"]["step_s"] / cost["free"]["step_s"]
    res = {"items": 2, "split": "test", "rows": rows, "cost": [cost]}
    targets = structured_targets(res)
    assert [t["key"] for t in targets] == ["valid_small", "cost_b2"]
    assert targets[0]["status"] == ("PASS" if rows[1]["schema_valid"] == 1 else "MISS")
    text = render_structured(res)
    assert "small" in text and f"{cost['ratio']:.2f}" in text
