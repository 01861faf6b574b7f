"""The jitted training step: the model's own ``forward`` under ``jax.value_and_grad``, and an optax update.

* The loss is the mean cross-entropy of the next token over the answer tokens (:mod:`jaxlab.train.data`'s weights).
* What is trained is a pytree ``trainable``; ``build(trainable, frozen)`` turns it into the model's parameters. For
  LoRA, ``trainable`` is the adapter and ``build`` is :func:`jaxlab.train.lora.apply`: the base weights are
  ``frozen``, an ordinary argument, so no gradient is computed for them. For a full fine-tune, ``trainable`` is the
  whole :class:`~jaxlab.engine.model.Params` and ``frozen`` is None.
* The optimizer (:func:`optimizer`): AdamW with a linear warm-up then a cosine decay, after clipping the gradient's
  global norm.
* The step donates ``trainable`` and the optimizer state: XLA updates them in place instead of holding two copies.
* ``remat`` runs every layer under ``jax.checkpoint`` (:func:`jaxlab.engine.model.forward`): the backward pass
  recomputes each layer's inside instead of keeping it, trading time for memory (``jaxlab bench --train`` measures it).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Any, Callable

import jax
import jax.numpy as jnp
import optax

from jaxlab.engine.model import Params, forward
from jaxlab.errors import ConfigError
from jaxlab.train import lora

Array = jax.Array


@dataclass(frozen=True)
class TrainConfig:
    steps: int = 300
    lr: float = 2e-3  # the peak learning rate (after warm-up)
    warmup: int = 20  # steps of linear warm-up from 0
    end_lr_ratio: float = 0.1  # the cosine decays to lr * this at the last step
    weight_decay: float = 0.0
    clip: float = 1.0  # the gradient's global norm is clipped to this
    batch_size: int = 8
    remat: bool = False
    seed: int = 0

    def __post_init__(self):
        for name in ("steps", "batch_size"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ConfigError(f"{name} must be a positive integer, got {v!r}")
        if not self.lr > 0:
            raise ConfigError(f"the learning rate must be positive, got {self.lr!r} (try 1e-3 for LoRA)")
        if not 0 <= self.warmup < self.steps:
            raise ConfigError(f"warm-up must be in 0..steps-1 ({self.steps - 1}), got {self.warmup}")


def schedule(cfg: TrainConfig) -> optax.Schedule:
    return optax.warmup_cosine_decay_schedule(
        init_value=0.0,
        peak_value=cfg.lr,
        warmup_steps=cfg.warmup,
        decay_steps=cfg.steps,
        end_value=cfg.lr * cfg.end_lr_ratio,
    )


def optimizer(cfg: TrainConfig) -> optax.GradientTransformation:
    return optax.chain(optax.clip_by_global_norm(cfg.clip), optax.adamw(schedule(cfg), weight_decay=cfg.weight_decay))


def token_loss(logits: Array, targets: Array, weights: Array) -> tuple[Array, Array]:
    """Mean cross-entropy of the targets under the logits, over the weighted (answer) tokens.

    logits [B, A, V], targets and weights [B, A] -> (loss, number of scored tokens)."""
    logp = jax.nn.log_softmax(logits, axis=-1)  # [B, A, V]
    nll = -jnp.take_along_axis(logp, targets[..., None], axis=-1)[..., 0]  # [B, A]
    n = jnp.maximum(weights.sum(), 1.0)
    return (nll * weights).sum() / n, weights.sum()


def lora_build(config: lora.LoraConfig) -> Callable[[Any, Params], Params]:
    return lambda adapter, params: lora.apply(params, adapter, config)


def full_build(trainable: Params, frozen: None) -> Params:
    return trainable


def loss_fn(trainable, frozen, batch: dict, *, build, remat: bool = False):
    """batch: the arrays of a :class:`jaxlab.train.data.Batch` (:func:`device_batch`)."""
    params = build(trainable, frozen)
    logits, _ = forward(params, batch["tokens"], batch["positions"], remat=remat, at=batch["at"])
    return token_loss(logits, batch["targets"], batch["weights"])


def device_batch(batch) -> dict:
    """A :class:`jaxlab.train.data.Batch` as a dict of device arrays (what the jitted steps take)."""
    return {k: jnp.asarray(getattr(batch, k)) for k in ("tokens", "positions", "at", "targets", "weights")}


@partial(jax.jit, static_argnames=("build", "opt", "remat"), donate_argnums=(0, 1))
def train_step(trainable, opt_state, frozen, batch: dict, *, build, opt, remat: bool = False):
    """One update: (trainable, optimizer state, frozen, batch) -> (trainable, optimizer state, metrics)."""
    (loss, n), grads = jax.value_and_grad(loss_fn, has_aux=True)(trainable, frozen, batch, build=build, remat=remat)
    updates, opt_state = opt.update(grads, opt_state, trainable)
    trainable = optax.apply_updates(trainable, updates)
    return trainable, opt_state, {"loss": loss, "tokens": n, "grad_norm": optax.tree.norm(grads)}


@partial(jax.jit, static_argnames=("build",))
def eval_loss(trainable, frozen, batch: dict, *, build):
    """(summed loss, scored tokens) of a batch, without a gradient."""
    loss, n = loss_fn(trainable, frozen, batch, build=build)
    return loss * n, n
