"""The compiled-program cache: a program lowered ahead (to read its text) is the one compiled, lowered once."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxlab.engine.programs import Programs


class CountingJit:
    """A jitted function that counts its lowerings."""

    def __init__(self):
        self.jitted, self.lowerings = jax.jit(lambda x: x * 2.0), 0

    def lower(self, *args, **kwargs):
        self.lowerings += 1
        return self.jitted.lower(*args, **kwargs)


def test_a_program_lowered_ahead_is_compiled_without_lowering_again():
    x = (jnp.ones(3),)
    for compile_it in (
        lambda programs, f: programs.get("double", f, x)[0],
        lambda programs, f: programs.compile_many([("double", f, x, None)]),
    ):
        programs, f = Programs(), CountingJit()
        assert "multiply" in programs.lower("double", f, x).as_text()
        assert programs.lower("double", f, x) is programs.lower("double", f, x)  # kept, not lowered again
        compile_it(programs, f)
        assert f.lowerings == 1 and len(programs) == 1
        fn, seconds = programs.get("double", f, x)
        assert seconds == 0.0 and float(fn(*x)[0]) == 2.0 and f.lowerings == 1
