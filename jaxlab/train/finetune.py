"""The fine-tuning run: batches, the jitted step, a progress bar, checkpoints that resume exactly, evaluation.

:func:`finetune` trains a LoRA adapter on ``{"prompt", "answer"}`` examples and writes into ``out``:

* ``adapter.json`` + ``adapter.safetensors``: the adapter (:func:`jaxlab.train.lora.save`), what
  ``jaxlab generate --adapter DIR`` and ``jaxlab export --adapter DIR`` read;
* ``history.json``: the loss of every step, the validation loss every ``eval_every`` steps, tokens/s, the host;
* ``checkpoint/``: the adapter, the optimizer state and the step, written every ``save_every`` steps. A run
  started again with the same ``out`` continues from it, and because the batch of every step is a function of
  (seed, step) (:class:`jaxlab.train.data.Batches`) and the optimizer state is restored leaf for leaf, it
  produces the same losses as a run that never stopped (a test checks it).

:func:`evaluate` generates greedy answers (the adapter merged into the weights) and scores them with the task's
:func:`~jaxlab.train.task.score`.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import jax
import numpy as np

from jaxlab.engine.generate import Generator
from jaxlab.engine.model import Params
from jaxlab.errors import ConfigError, InvalidRequestError
from jaxlab.io.tokenizer import prompt_ids
from jaxlab.tools.hardware import cpu_name
from jaxlab.train import data, lora, step
from jaxlab.train.task import score

CHECKPOINT = "checkpoint"


@dataclass
class History:
    steps: list[int] = field(default_factory=list)
    loss: list[float] = field(default_factory=list)
    val_steps: list[int] = field(default_factory=list)
    val_loss: list[float] = field(default_factory=list)
    seconds: float = 0.0  # training time (steps only, compiles excluded)
    compile_seconds: float = 0.0
    wall_seconds: float = 0.0  # the whole run: steps, compiles, validation and checkpoints (summed over resumes)
    tokens: int = 0  # real (non-padding) tokens through the model

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / self.seconds if self.seconds else float("nan")


def _tree_to_npz(path: Path, tree) -> None:
    leaves = jax.tree.leaves(tree)
    np.savez(path, *[np.asarray(x) for x in leaves])


def _npz_to_tree(path: Path, like):
    with np.load(path) as f:
        leaves = [f[f"arr_{i}"] for i in range(len(f.files))]
    treedef = jax.tree.structure(like)
    if treedef.num_leaves != len(leaves):
        raise ConfigError(
            f"{path}: the checkpoint holds {len(leaves)} arrays, this run needs {treedef.num_leaves} "
            "(it was written with other options: use another --out, or delete it)"
        )
    return jax.tree.unflatten(
        treedef, [jax.numpy.asarray(x, dtype=getattr(y, "dtype", None)) for x, y in zip(leaves, jax.tree.leaves(like))]
    )


def save_checkpoint(folder: Path, adapter, opt_state, at_step: int, history: History, settings: dict) -> None:
    tmp = folder.with_name(folder.name + ".tmp")
    tmp.mkdir(parents=True, exist_ok=True)
    _tree_to_npz(tmp / "adapter.npz", adapter)
    _tree_to_npz(tmp / "optimizer.npz", opt_state)
    (tmp / "state.json").write_text(json.dumps({"step": at_step, "settings": settings, "history": asdict(history)}))
    if folder.exists():
        for f in folder.iterdir():
            f.unlink()
        folder.rmdir()
    tmp.rename(folder)  # a crash while writing leaves the previous checkpoint whole


def _settings(lora_config: lora.LoraConfig, train_config: step.TrainConfig, n_examples: int) -> dict:
    return {"lora": asdict(lora_config), "train": asdict(train_config), "examples": n_examples}


def finetune(
    params: Params,
    tokenizer,
    examples: Sequence[dict],
    out: str | os.PathLike | None = None,
    *,
    lora_config: lora.LoraConfig = lora.LoraConfig(),
    train_config: step.TrainConfig = step.TrainConfig(),
    validation: Sequence[dict] = (),
    eval_every: int = 50,
    save_every: int = 50,
    stop_after: int | None = None,
    progress: bool | None = None,
    on_step: Callable[[int, dict], None] | None = None,
):
    """Train a LoRA adapter; returns (adapter, History). See the module docstring for ``out``.

    ``stop_after`` ends the run after that many steps of this call (a checkpoint is written), as an interrupted
    run would: running again continues it."""
    from tqdm.auto import tqdm

    if params.quant:
        raise ConfigError(
            f"fine-tuning runs on float weights; these are {params.quant}-quantized: load the model without --quant"
        )
    tc, lc = train_config, lora_config
    encoded = [data.encode_example(tokenizer, e) for e in examples]
    pad = tokenizer.pad_id if tokenizer.pad_id is not None else params.config.eos_id
    batches = data.Batches(encoded, tc.batch_size, pad, seed=tc.seed, max_len=params.config.max_seq_len)
    val = [data.encode_example(tokenizer, e) for e in validation]
    opt = step.optimizer(tc)
    build = step.lora_build(lc)
    adapter = lora.init_adapter(params, lc, tc.seed)
    opt_state = opt.init(adapter)
    history, start = History(), 0
    settings = _settings(lc, tc, len(examples))
    ckpt = Path(out) / CHECKPOINT if out is not None else None
    if ckpt is not None and (ckpt / "state.json").is_file():
        state = json.loads((ckpt / "state.json").read_text())
        if state["settings"] != json.loads(json.dumps(settings)):
            raise ConfigError(
                f"{ckpt} was written by a run with other settings ({state['settings']}); resume with the same "
                "options, or give another --out"
            )
        adapter = _npz_to_tree(ckpt / "adapter.npz", adapter)
        opt_state = _npz_to_tree(ckpt / "optimizer.npz", opt_state)
        start, history = state["step"], History(**state["history"])
    end = tc.steps if stop_after is None else min(tc.steps, start + stop_after)
    wall0 = time.perf_counter() - history.wall_seconds
    bar = tqdm(total=tc.steps, initial=start, desc="fine-tuning", unit="step", disable=progress is False)
    shapes = set()  # the batch shapes seen: a new one compiles, and its step is counted as compiling
    for s in range(start, end):
        batch = batches.at(s)
        t0 = time.perf_counter()
        adapter, opt_state, metrics = step.train_step(
            adapter, opt_state, params, step.device_batch(batch), build=build, opt=opt, remat=tc.remat
        )
        loss = float(metrics["loss"])  # waits for the step
        dt = time.perf_counter() - t0
        shape = (batch.tokens.shape, batch.at.shape)
        if shape not in shapes:
            shapes.add(shape)
            history.compile_seconds += dt
        else:
            history.seconds += dt
            history.tokens += batch.n_tokens
        history.steps.append(s + 1)
        history.loss.append(loss)
        if val and ((s + 1) % eval_every == 0 or s + 1 == tc.steps):
            history.val_steps.append(s + 1)
            history.val_loss.append(validation_loss(adapter, params, val, build, pad, tc.batch_size))
        bar.update(1)
        bar.set_postfix(loss=f"{loss:.3f}", tok_s=f"{history.tokens_per_second:.0f}")
        if on_step is not None:
            on_step(s + 1, {"loss": loss, "grad_norm": float(metrics["grad_norm"])})
        history.wall_seconds = time.perf_counter() - wall0
        if ckpt is not None and ((s + 1) % save_every == 0 or s + 1 == end):
            save_checkpoint(ckpt, adapter, opt_state, s + 1, history, settings)
    bar.close()
    if out is not None and end == tc.steps:
        lora.save(out, adapter, lc, base=params.config.name, extra={"train": asdict(tc)})
        record = {
            **asdict(history),
            "tokens_per_second": history.tokens_per_second,
            "settings": settings,
            "host": {"cpu": cpu_name(), "backend": jax.default_backend(), "jax": jax.__version__},
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        }
        (Path(out) / "history.json").write_text(json.dumps(record, indent=1))
    return adapter, history


def validation_loss(adapter, params, encoded, build, pad_id: int, batch_size: int) -> float:
    """Mean answer-token loss over the encoded examples (batches of ``batch_size``, the last one padded)."""
    total = n = 0.0
    for i in range(0, len(encoded), batch_size):
        rows = encoded[i : i + batch_size]
        rows = rows + [rows[-1]] * (batch_size - len(rows))  # a full batch: one compiled shape
        b = data.make_batch(rows, pad_id)
        keep = min(batch_size, len(encoded) - i)
        b = data.Batch(b.tokens, b.positions, b.at, b.targets, b.weights * (np.arange(batch_size) < keep)[:, None])
        s, c = step.eval_loss(adapter, params, step.device_batch(b), build=build)
        total, n = total + float(s), n + float(c)
    return total / n


def evaluate(
    params: Params,
    tokenizer,
    examples: Sequence[dict],
    *,
    adapter=None,
    lora_config=None,
    batch_size: int = 50,
    max_new_tokens: int = 48,
    progress: bool | None = None,
) -> dict:
    """Greedy answers to ``examples`` and their scores: {"exact", "match" (fractions), "n", "replies"}."""
    from tqdm.auto import tqdm

    if not examples:
        raise InvalidRequestError("no examples to evaluate")
    if adapter is not None:
        params = lora.merge(params, adapter, lora_config)
    gen = Generator(params, tokenizer)
    replies = []
    for i in tqdm(range(0, len(examples), batch_size), desc="evaluating", disable=progress is False, leave=False):
        prompts = [prompt_ids(tokenizer, e["prompt"]) for e in examples[i : i + batch_size]]
        replies += [r.text for r in gen.generate(prompts, max_new_tokens=max_new_tokens)]
    scores = [score(r, e["answer"]) for r, e in zip(replies, examples)]
    return {
        "exact": sum(s["exact"] for s in scores) / len(scores),
        "match": sum(s["match"] for s in scores) / len(scores),
        "n": len(scores),
        "replies": replies,
    }
