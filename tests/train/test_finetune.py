"""The training loop: the loss falls, a checkpointed run resumes with exactly the same losses, and the
learning rate warms up, then decays on a cosine."""

import json

import numpy as np
import pytest
from test_data import CharTokenizer

from jaxlab.engine.model import init_params
from jaxlab.errors import ConfigError
from jaxlab.io.config import tiny
from jaxlab.train import finetune, lora, step

EXAMPLES = [{"prompt": f"what is {i} plus {i}?", "answer": str(2 * i)} for i in range(24)]
LORA = lora.LoraConfig(rank=4)
TRAIN = step.TrainConfig(steps=6, lr=1e-2, warmup=1, batch_size=4)


def run(out, **options):
    """A fine-tuning run of the tiny model on EXAMPLES into ``out`` (validation every 3 steps)."""
    options = {"lora_config": LORA, "train_config": TRAIN, "validation": EXAMPLES[:5], "eval_every": 3, **options}
    return finetune.finetune(init_params(tiny(), 0), CharTokenizer(), EXAMPLES, out, progress=False, **options)


def test_resumed_run_gives_the_same_losses_as_an_unbroken_one(tmp_path):
    _, whole = run(tmp_path / "whole")
    assert whole.loss[-1] < whole.loss[0]  # it learns
    _, first = run(tmp_path / "broken", save_every=2, stop_after=3)
    assert first.steps == [1, 2, 3] and not (tmp_path / "broken" / "adapter.json").exists()
    _, resumed = run(tmp_path / "broken", save_every=2)
    assert resumed.steps == whole.steps
    np.testing.assert_array_equal(resumed.loss, whole.loss)  # bit for bit
    np.testing.assert_array_equal(resumed.val_loss, whole.val_loss)
    a, _, _ = lora.load(tmp_path / "whole")
    b, _, _ = lora.load(tmp_path / "broken")
    for name in a:
        np.testing.assert_array_equal(np.asarray(a[name]["b"]), np.asarray(b[name]["b"]))
    record = json.loads((tmp_path / "whole" / "history.json").read_text())
    assert record["settings"]["lora"]["rank"] == 4 and record["host"]["cpu"]
    with pytest.raises(ConfigError, match="other settings"):
        run(tmp_path / "broken", lora_config=lora.LoraConfig(rank=2))


def test_schedule_warms_up_then_decays_and_bad_settings_are_refused():
    cfg = step.TrainConfig(steps=100, lr=1e-3, warmup=10, end_lr_ratio=0.1)
    lr = step.schedule(cfg)
    assert float(lr(0)) == 0.0 and float(lr(5)) == pytest.approx(5e-4) and float(lr(10)) == pytest.approx(1e-3)
    assert float(lr(100)) == pytest.approx(1e-4) and float(lr(55)) < 1e-3
    for bad in (dict(steps=0), dict(lr=0.0), dict(steps=10, warmup=10), dict(batch_size=0)):
        with pytest.raises(ConfigError):
            step.TrainConfig(**bad)
