"""jaxlab.lab.vectorize: counting a jaxpr's operations (nested calls included) and notebook 06's figures."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from jaxlab.lab import vectorize


def test_count_primitives_sees_nested_jits_and_vmap_keeps_the_matmuls():
    inner = jax.jit(lambda w, x: jnp.tanh(x @ w))

    def f(w, x):  # one row x [D] -> [D]
        return inner(w, x) @ w

    w, xs = jnp.ones((4, 4)), jnp.ones((3, 4))
    one = vectorize.count_primitives(jax.make_jaxpr(f)(w, xs[0]))
    many = vectorize.count_primitives(jax.make_jaxpr(jax.vmap(f, in_axes=(None, 0)))(w, xs))
    assert one["dot_general"] == 2 and one["tanh"] == 1  # the matmul inside the nested jit is counted
    assert many["dot_general"] == one["dot_general"]  # vmap adds a batch axis, not a loop over the rows


def test_figures_have_titles_and_labels():
    import matplotlib

    matplotlib.use("Agg")
    rows = [{"batch": b, "tokens/s": 10.0 * b**0.8, "bound tokens/s": 20.0 * b} for b in (1, 2, 4)]
    fig = vectorize.plot_throughput(rows)
    ax = fig.axes[0]
    assert len(ax.lines) == 3 and ax.get_title() and ax.get_xlabel() and ax.get_ylabel()
    fig = vectorize.plot_distributions({"a": np.array([0.5, 0.5, 0.0]), "b": np.array([1.0, 0.0, 0.0])})
    assert len(fig.axes) == 2 and all(ax.get_title() for ax in fig.axes) and fig.axes[0].get_ylabel()
