"""jaxlab.lab.masks: the NumPy mask is the model's rule, and the figure draws one panel per row."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from jaxlab.engine.kvcache import left_pad
from jaxlab.engine.model import Attention, default_policy, rope_cos_sin
from jaxlab.io.config import tiny
from jaxlab.lab import masks


def test_visible_is_causal_and_hides_padding():
    _, pos = left_pad([[1, 2, 3], [4]], pad_id=0)
    v = masks.visible(pos, pos)
    assert v.shape == (2, 3, 3)
    assert (v[0] == np.tril(np.ones((3, 3), bool))).all()
    assert v[1].tolist() == [[False] * 3, [False] * 3, [False, False, True]]
    assert masks.visible_counts(pos).tolist() == [[1, 2, 3], [0, 0, 1]]


def test_visible_agrees_with_the_model():
    # a key the mask hides must not change the attention output; a visible one must
    from flax import nnx

    cfg = tiny()
    attn = Attention(cfg, default_policy(), nnx.Rngs(0))
    _, pos = left_pad([[1, 2, 3, 4], [5, 6]], pad_id=0)
    pos = jnp.asarray(pos)
    cos, sin = rope_cos_sin(pos, cfg.head_dim, cfg.rope_theta)
    x = jax.random.normal(jax.random.key(0), (2, 4, cfg.dim))
    out, _ = attn(x, pos, cos, sin)
    v = masks.visible(pos, pos)
    for b, s in [(1, 0), (0, 3)]:  # a padding key of row 1; the last key of row 0
        x2 = x.at[b, s].set(x[b, s] + 5.0)
        out2, _ = attn(x2, pos, cos, sin)
        for t in range(4):
            if t == s or pos[b, t] < 0:  # a padding query sees nothing: its (unused) output is a uniform mix
                continue
            changed = not np.allclose(out[b, t], out2[b, t], atol=1e-6)
            assert changed == bool(v[b, t, s]), (b, t, s)


def test_plot_masks_one_panel_per_row():
    import matplotlib

    matplotlib.use("Agg")
    _, pos = left_pad([[1, 2, 3], [4, 5], [6]], pad_id=0)
    fig = masks.plot_masks(pos)
    assert len(fig.axes) == 3 and all(ax.images and ax.get_title() for ax in fig.axes)
    assert fig.axes[0].get_xlabel() and fig.axes[0].get_ylabel()
