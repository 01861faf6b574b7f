"""Notebook 15's exercise checkers (PASS on the solutions, FAIL on wrong answers) and the stored results it reads."""

from __future__ import annotations

import json

import numpy as np
from conftest import load_solution

from jaxlab.io.assets import data_file
from jaxlab.lab import finetuning
from jaxlab.lab.exercises import nb15
from jaxlab.train import task


def test_nb15_checkers_pass_solutions_and_fail_wrong_answers(capsys):
    sol = load_solution("15_finetuning")
    assert nb15.check_answer_loss(sol.my_answer_loss)
    assert nb15.check_lora_dot(sol.my_lora_dot)
    assert nb15.check_merge(sol.my_merge)

    def unmasked(logits, targets, weights):  # every position counted, padding included
        return sol.my_answer_loss(logits, targets, np.ones_like(np.asarray(weights)))

    assert not nb15.check_answer_loss(unmasked)
    assert not nb15.check_lora_dot(lambda x, w, a, b, s: np.asarray(x) @ np.asarray(w))  # the adapter left out
    assert not nb15.check_merge(lambda w, a, b, s: np.asarray(w) + np.asarray(a) @ np.asarray(b))  # no scale
    out = capsys.readouterr().out
    assert "PASS: masked next-token loss" in out and "FAIL: merged kernel" in out


def test_stored_run_meets_the_targets_and_is_the_shipped_test_split():
    run = finetuning.stored_run()
    assert run["host"]["cpu"] and "UTC" in run["date"] and run["settings"]["train"]["steps"] == len(run["loss"])
    assert run["wall_seconds"] <= 600  # the "<= 10 minutes of training" on the host that ran it
    test = [json.loads(line) for line in data_file("finetune", "test.jsonl").read_text().splitlines()]
    for name in ("base", "tuned"):
        r = run["test"][name]
        assert r["n"] == len(test) == len(r["replies"])
        # the stored fractions are what the stored replies score: nothing typed in
        assert r["match"] == sum(task.score(x, e["answer"])["match"] for x, e in zip(r["replies"], test)) / len(test)
    assert run["test"]["base"]["match"] <= 0.2 and run["test"]["tuned"]["match"] >= 0.6


def test_stored_bench_and_peer_check_have_what_the_notebook_reads():
    bench = finetuning.stored_bench()
    assert {r["variant"] for r in bench["rows"]} == {"LoRA", "LoRA + remat", "full", "full + remat"}
    assert set(bench["remat_trade"]) == {"LoRA", "full"} and bench["meta"]["cpu"]
    peers = finetuning.stored_peers()
    assert [r["qtype"] for r in peers["files"]] == ["F16", "Q8_0"] and all(r["status"] for r in peers["files"])
