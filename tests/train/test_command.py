"""`jaxlab finetune` and `--adapter`: bad input ends in one clear line before any model is loaded or trained, and an
adapter folder merges into the real model."""

import numpy as np
import pytest
from conftest import one_clean_line, run_main

from jaxlab.cli import main
from jaxlab.engine.model import init_params
from jaxlab.errors import ConfigError
from jaxlab.io.config import tiny
from jaxlab.train import lora


@pytest.mark.parametrize(
    "args, match",
    [
        (["finetune", "--out", "{tmp}/o", "--data", "{tmp}/missing.jsonl"], "no such file"),
        (["finetune", "--out", "{tmp}/o", "--data", "{tmp}/bad.jsonl"], "not JSON"),
        (["finetune", "--out", "{tmp}/o", "--rank", "0"], "rank must be a positive integer"),
        (["finetune", "--out", "{tmp}/o", "--targets", "wq,embed"], "LoRA targets"),
        (["finetune", "--out", "{tmp}/o", "--steps", "5", "--warmup", "5"], "warm-up"),
        (["finetune", "--out", "{tmp}/o", "--lr", "-1"], "learning rate must be positive"),
        (["generate", "--adapter", "{tmp}", "--quant", "int8", "hi"], "--adapter with --quant is not supported"),
        (["finetune", "--steps", "3"], "required"),
    ],
)
def test_bad_finetune_requests_end_in_one_line(tmp_path, capsys, args, match):
    (tmp_path / "bad.jsonl").write_text("not json\n")
    code, _, err = run_main(capsys, [a.replace("{tmp}", str(tmp_path)) for a in args])
    assert code != 0 and match in one_clean_line(err)


def test_adapter_folder_merges_into_the_real_model_and_a_foreign_one_is_refused(smollm, tmp_path):
    config = lora.LoraConfig(rank=2, targets=("wq",))
    adapter = lora.init_adapter(smollm.params, config, 0)
    name = "layers.3.attn.wq"
    adapter[name]["b"] = adapter[name]["b"] + 0.01
    lora.save(tmp_path / "real", adapter, config, base=smollm.config.name)
    merged = lora.merge_folder(smollm.params, tmp_path / "real").flat()
    base = smollm.params.flat()
    want = np.asarray(base[name]) + config.scale * np.asarray(adapter[name]["a"]) @ np.asarray(adapter[name]["b"])
    np.testing.assert_allclose(np.asarray(merged[name]), want, atol=1e-6)
    np.testing.assert_array_equal(np.asarray(merged["layers.4.attn.wq"]), np.asarray(base["layers.4.attn.wq"]))
    small = init_params(tiny(), 0)
    lora.save(tmp_path / "tiny", lora.init_adapter(small, config), config, base="tiny")
    with pytest.raises(ConfigError, match="was trained on tiny"):
        lora.merge_folder(smollm.params, tmp_path / "tiny")


def test_generate_with_a_fresh_adapter_answers_as_the_base_model(smollm, tmp_path, capsys):
    config = lora.LoraConfig(rank=2)
    lora.save(tmp_path / "fresh", lora.init_adapter(smollm.params, config, 0), config, base=smollm.config.name)
    code = main(["generate", "--adapter", str(tmp_path / "fresh"), "--max-new-tokens", "8", "--json",
                 "What is the capital of France?"])  # fmt: skip
    out, _ = capsys.readouterr()
    assert code == 0 and "Paris" in out  # b = 0: the merged model is the base model
