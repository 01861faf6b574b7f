"""Checks for notebook 15's exercises: the masked next-token loss, the LoRA layer, and merging an adapter.

* ``my_answer_loss(logits [B, A, V], targets [B, A], weights [B, A])``: the mean cross-entropy of the targets over the
  weighted positions. Reference: :func:`jaxlab.train.step.token_loss` (its first output).
* ``my_lora_dot(x [N, I], w [I, O], a [I, R], b [R, O], scale)``: ``x w + scale (x a) b``.
  Reference: :meth:`jaxlab.train.lora.LoraKernel.dot`.
* ``my_merge(w, a, b, scale)``: the one kernel that computes what the adapted layer computes.
"""

from __future__ import annotations

import numpy as np

from jaxlab.lab.exercises import check_function


def reference_answer_loss(logits, targets, weights):
    from jaxlab.train.step import token_loss

    return np.asarray(
        token_loss(np.asarray(logits, np.float32), np.asarray(targets), np.asarray(weights, np.float32))[0]
    )


def _loss_inputs(rng):
    b, a, v = int(rng.integers(1, 4)), int(rng.integers(1, 6)), int(rng.integers(2, 9))
    weights = (rng.random((b, a)) < 0.7).astype(np.float32)
    weights[0, 0] = 1.0  # at least one scored position
    return rng.normal(size=(b, a, v)).astype(np.float32) * 3, rng.integers(0, v, size=(b, a)), weights


def check_answer_loss(fn, trials: int = 20) -> bool:
    return check_function(
        lambda lg, t, w: np.asarray(fn(lg, t, w), np.float32), reference_answer_loss, _loss_inputs,
        name="masked next-token loss", trials=trials, atol=1e-4, rtol=1e-4,
    )  # fmt: skip


def reference_lora_dot(x, w, a, b, scale):
    import jax

    from jaxlab.engine.model import default_policy
    from jaxlab.train.lora import LoraKernel

    x, w, a, b = (jax.numpy.asarray(np.asarray(m, np.float32)) for m in (x, w, a, b))
    return np.asarray(LoraKernel(w, a, b, float(scale)).dot(x, default_policy()))


def _lora_inputs(rng):
    n, i, o, r = (int(rng.integers(1, 6)) for _ in range(4))
    return (rng.normal(size=(n, i)), rng.normal(size=(i, o)), rng.normal(size=(i, r)), rng.normal(size=(r, o)),
            float(rng.choice([0.5, 1.0, 2.0])))  # fmt: skip


def check_lora_dot(fn, trials: int = 20) -> bool:
    return check_function(
        lambda *args: np.asarray(fn(*args), np.float32), reference_lora_dot, _lora_inputs, name="LoRA layer",
        trials=trials, atol=1e-4, rtol=1e-4,
    )  # fmt: skip


def check_merge(fn, trials: int = 20) -> bool:
    """The merged kernel must compute the adapted layer: x @ merged == x w + scale (x a) b for random x."""

    def via_merge(w, a, b, scale, x):
        return np.asarray(x, np.float32) @ np.asarray(fn(w, a, b, scale), np.float32)

    def reference(w, a, b, scale, x):
        return reference_lora_dot(x, w, a, b, scale)

    def inputs(rng):
        x, w, a, b, scale = _lora_inputs(rng)
        return w, a, b, scale, x

    return check_function(via_merge, reference, inputs, name="merged kernel", trials=trials, atol=1e-4, rtol=1e-4)
