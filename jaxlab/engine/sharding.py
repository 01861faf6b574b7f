"""Multi-device inference: the parameters and the KV cache placed on a mesh, and three ways to split generation.

The mesh and the logical-axis rules are in :mod:`jaxlab.engine.mesh`; a *strategy* is one set of rules:

- ``data``: batch -> data. Each device holds all the weights, and B / data rows with their cache.
- ``tensor``: q_heads, kv_heads, mlp -> model. Each device holds H / model heads (wq, wk, wv split by
  columns, wo by rows), F / model MLP units (w_gate, w_up by columns, w_down by rows), the cache of
  its KV heads, and every row. Two all-reduces per layer add the row-split matmuls' partial sums.
- ``data+tensor``: both, on a 2-D mesh: each device holds a block of rows x a block of heads.

* **Three implementations, one forward pass.** ``jit`` + ``NamedSharding`` (the strategies above: we say
  where inputs and outputs live, the XLA SPMD partitioner inserts the collectives); ``shard_map`` (tensor
  parallel, and data parallel on a 2-D mesh, written as the per-device program: the model's own
  :func:`~jaxlab.engine.model.forward` built for the local head count, with its ``reduce`` hook set to a
  ``psum`` over ``model`` — the two all-reduces per layer made explicit); ``pmap`` (data parallel, the
  legacy API: one program per local device, a leading device axis). All three run the step toolkit's
  programs (:func:`~jaxlab.engine.steps.greedy_step`, :func:`~jaxlab.engine.steps.next_logits`), and
  :class:`Sharded` is a :class:`~jaxlab.engine.generate.Placement`: it says where rows, caches and programs live,
  and the :class:`~jaxlab.engine.generate.Generator`'s own loop (:func:`~jaxlab.engine.generate.host_loop`: the
  plan, the prompt chunks, one decode call per token, :class:`~jaxlab.engine.generate.TextStops`) runs it. Quantized parameters (:mod:`jaxlab.quant`) and the int8
  KV cache run unchanged: a quantized matrix is placed leaf by leaf (:func:`jaxlab.engine.mesh.value_specs`).
* **Placement** (:mod:`jaxlab.engine.placement`): heads padded until ``model`` divides them
  (:func:`~jaxlab.engine.placement.pad_heads`), every parameter placed where its rules say, and the KV
  cache kept in a *split view*, K ``[B, KVH, S, Hd]``, so that splitting rows never cuts through heads.
  ``jit`` strategies ``vmap`` the step over rows (:func:`per_row`: each row's cache ``[KVH, S, Hd]`` is
  exactly the model's layout for batch 1); ``shard_map`` merges the two axes *locally*, where it is free.

Entry points: :func:`shard` (params + mesh + strategy -> :class:`Sharded`, with ``generate``,
``generate_results``, ``logits``, ``prompt_logits``, and the compiled decode step for a shape,
``decode_program``) and :func:`shard_generate`. What the programs cost (their collectives, step times,
bytes per device) is measured in :mod:`jaxlab.lab.parallel`. Generation here is greedy (the comparison
with the single-device :class:`~jaxlab.engine.generate.Generator` is exact token equality). The same
code runs in one process or many (:mod:`jaxlab.distributed`): inputs are built with
``jax.make_array_from_callback`` when the mesh spans processes, and outputs are gathered with
``multihost_utils.process_allgather``.
"""

from __future__ import annotations

import dataclasses
from functools import partial
from typing import Callable, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from jaxlab.engine.generate import GenerationResult, Placement, host_loop, start_request
from jaxlab.engine.kernels.cpu import xla_program
from jaxlab.engine.kvcache import KVCache, init_cache
from jaxlab.engine.mesh import (
    ROW_AXES,
    STRATEGIES,
    TOKEN_AXES,
    fit_mesh,
    format_mesh,
    logical_to_spec,
    make_mesh,
    mesh_shape,
    rules_for,
)
from jaxlab.engine.model import Llama, Params, forward
from jaxlab.engine.placement import (
    cache_specs,
    is_abstract,
    map_leaves,
    map_params,
    merge_heads,
    pad_heads,
    put,
    replicate_for_pmap,
    shard_params,
    split_cache_shapes,
    split_heads,
    to_host,
)
from jaxlab.engine.plan import plan
from jaxlab.engine.programs import Programs
from jaxlab.engine.sampling import sample
from jaxlab.engine.steps import GREEDY, greedy_step, next_logits
from jaxlab.errors import ConfigError, InvalidRequestError

_ROW_AXES = KVCache(k=0, v=0, pos=0, index=None, k_scale=0, v_scale=0)  # vmap: every array by row, not index


def per_row(step):
    """``step(params, tokens, positions, cache) -> (outputs [B, ...]..., cache)`` run on a split-view cache,
    ``vmap``-ed over rows (the ``jit`` strategies): each row is a batch of one whose cache [KVH, S, Hd] is
    exactly the model's layout, so splitting rows or heads never cuts through the other."""

    def run(params, tokens, positions, cache: KVCache):
        def one(tok, pos, c):
            *outs, c = step(params, tok[None], pos[None], dataclasses.replace(c, pos=c.pos[None]))
            return tuple(o[0] for o in outs), dataclasses.replace(c, pos=c.pos[0])

        outs, cache = jax.vmap(one, in_axes=(0, 0, _ROW_AXES), out_axes=(0, _ROW_AXES))(tokens, positions, cache)
        return (*outs, cache)

    run.__name__ = run.__qualname__ = f"{step.__name__}_per_row"  # what the HLO and profiles call it
    return run


def greedy_prefill(params: Params, tokens, positions, cache: KVCache, **hooks):
    """A prompt chunk [B, T] -> (next tokens [B], last-position logits [B, V], cache): the prefill form of
    :func:`~jaxlab.engine.steps.greedy_step` (the logits are what :meth:`Sharded.prompt_logits` returns)."""
    logits, cache = next_logits(params, tokens, positions, cache, **hooks)
    return sample(logits, None, GREEDY), logits, cache


# --------------------------------------------------------------------------------------------------
# The sharded model
# --------------------------------------------------------------------------------------------------


class Sharded(Placement):
    """A model placed on a mesh with one strategy: ``generate`` (greedy), ``generate_results``, ``logits``,
    ``prompt_logits``, ``decode_program``. ``config`` is the (padded) config the devices run.

    Build it with :func:`shard`. Each program is compiled ahead of time on first use for a shape and kept
    (:class:`~jaxlab.engine.programs.Programs`); ``compile_seconds`` adds up the time spent compiling."""

    def __init__(
        self,
        params: Params,
        mesh: Mesh,
        strategy: str = "auto",
        rules: Mapping[str, str | None] | None = None,
        cache_dtype=None,
    ):
        shape = mesh_shape(mesh)
        if strategy == "auto":
            strategy = "data" if shape["model"] == 1 else "tensor" if shape["data"] == 1 else "data+tensor"
        if strategy not in STRATEGIES:
            raise ConfigError(f"unknown strategy {strategy!r}; choose one of auto, {', '.join(STRATEGIES)}")
        self.strategy, self.mesh, self.shape = strategy, mesh, shape
        self.programs = Programs()
        self.cache_dtype = jnp.dtype(cache_dtype or params.policy.jnp_dtype)
        self._prompt = None  # (last-position logits, real rows) of the latest generate call
        if rules and strategy in ("shard_map", "pmap"):
            raise ConfigError(f"rule overrides apply to the jit strategies; {strategy} is written for its own layout")
        self.rules = rules_for(strategy, rules)
        if strategy == "pmap":
            if shape["model"] != 1:
                raise ConfigError(f"pmap maps over one axis: use a mesh data=N,model=1 (got {format_mesh(shape)})")
            if jax.process_count() > 1:
                raise ConfigError("pmap maps over local devices only; use a jit or shard_map strategy across processes")
            self.devices = list(mesh.devices.flat)
            self.params = replicate_for_pmap(params, self.devices)
            self.config = params.config
            self._build_pmap()
            return
        uses_model = any(v == "model" for v in self.rules.values())
        if uses_model and shape["model"] > 1:
            m = shape["model"]
            # shapes in (a program compiled for chips that are not here): the padded model's shapes out
            params = jax.eval_shape(lambda p: pad_heads(p, m), params) if is_abstract(params) else pad_heads(params, m)
        self.config = params.config
        self.params = shard_params(params, mesh, self.rules)
        self.param_shardings = map_params(self.params, lambda n, v: map_leaves(lambda a: a.sharding, v))
        self._cache_sh = jax.tree.map(
            lambda s: NamedSharding(mesh, s),
            cache_specs(self.config, self.rules, mesh, quantized=self.cache_dtype == jnp.int8),
            is_leaf=lambda s: isinstance(s, P),
        )
        if strategy == "shard_map":
            self._build_shard_map()
        else:
            self._build_jit()

    @property
    def compile_seconds(self) -> float:
        return self.programs.compile_seconds_total

    # -- shardings ---------------------------------------------------------------------------

    def spec(self, logical_axes: Sequence[str | None]) -> P:
        return logical_to_spec(logical_axes, self.rules, self.mesh)

    def sharding(self, logical_axes: Sequence[str | None]) -> NamedSharding:
        return NamedSharding(self.mesh, self.spec(logical_axes))

    @property
    def rows_multiple(self) -> int:
        """The batch is padded (with copies of the first prompt) to a multiple of this."""
        return self.shape["data"] if "batch" in self.rules else 1

    # -- jit + NamedSharding -------------------------------------------------------------------

    def _build_jit(self):
        cache, tok, row = self._cache_sh, self.sharding(TOKEN_AXES), self.sharding(ROW_AXES)
        ps = self.param_shardings
        self._prefill = jax.jit(
            xla_program(per_row(greedy_prefill)),
            in_shardings=(ps, tok, tok, cache),
            out_shardings=(row, row, cache),
            donate_argnums=(3,),
        )
        self._decode = jax.jit(
            xla_program(per_row(greedy_step)),
            in_shardings=(ps, row, row, cache),
            out_shardings=(row, row, cache),
            donate_argnums=(3,),
        )
        self._logits = jax.jit(
            xla_program(lambda params, tokens, positions: forward(params, tokens, positions)[0]),
            in_shardings=(ps, tok, tok),
            out_shardings=self.sharding(("batch",)),
        )

    # -- shard_map -----------------------------------------------------------------------------

    def _build_shard_map(self):
        """The per-device program: ``forward`` on this device's heads (a graphdef built for the local sizes)
        and its split-view cache merged locally, with ``reduce`` = psum over ``model``."""
        cfg, m = self.config, self.mesh.shape["model"]
        local_cfg = cfg.replace(n_heads=cfg.n_heads // m, n_kv_heads=cfg.n_kv_heads // m, ffn_dim=cfg.ffn_dim // m)
        graphdef, _ = nnx.split(nnx.eval_shape(lambda: Llama(local_cfg, self.params.policy, rngs=nnx.Rngs(0))))
        psum = partial(jax.lax.psum, axis_name="model")  # all-reduce: the row-parallel wo's and w_down's partial sums

        def local(step):
            def run(params, tokens, positions, cache):
                *outs, cache = step(Params(graphdef, params.state), tokens, positions, merge_heads(cache), reduce=psum)
                return (*outs, split_heads(cache))

            run.__name__ = run.__qualname__ = f"{step.__name__}_on_device"
            return run

        def logits(params, tokens, positions):
            return forward(Params(graphdef, params.state), tokens, positions, reduce=psum)[0]

        pspecs = map_params(self.params, lambda n, v: map_leaves(lambda a: a.sharding.spec, v))
        cspecs = jax.tree.map(lambda s: s.spec, self._cache_sh)
        tok, row = self.spec(TOKEN_AXES), self.spec(ROW_AXES)
        sm = partial(jax.shard_map, mesh=self.mesh)
        self._prefill = jax.jit(
            sm(xla_program(local(greedy_prefill)), in_specs=(pspecs, tok, tok, cspecs), out_specs=(row, row, cspecs)),
            donate_argnums=(3,),
        )
        self._decode = jax.jit(
            sm(xla_program(local(greedy_step)), in_specs=(pspecs, row, row, cspecs), out_specs=(row, row, cspecs)),
            donate_argnums=(3,),
        )
        self._logits = jax.jit(sm(xla_program(logits), in_specs=(pspecs, tok, tok), out_specs=self.spec(("batch",))))

    # -- pmap ----------------------------------------------------------------------------------

    def _build_pmap(self):
        # params: in_axes=None broadcasts them to every device (each device holds a full copy, placed once)
        pm = partial(jax.pmap, axis_name="data", devices=self.devices)
        self._prefill = pm(xla_program(greedy_prefill), in_axes=(None, 0, 0, 0), donate_argnums=(3,))
        self._decode = pm(xla_program(greedy_step), in_axes=(None, 0, 0, 0), donate_argnums=(3,))
        self._logits = pm(
            xla_program(lambda params, tokens, positions: forward(params, tokens, positions)[0]), in_axes=(None, 0, 0)
        )

    # -- running -------------------------------------------------------------------------------

    def _call(self, name: str, args: tuple):
        """Run program ``name`` on ``args`` -> (its outputs, seconds spent compiling it now)."""
        program, seconds = self.programs.get(name, getattr(self, "_" + name), args)
        return program(*args), seconds

    def check_rows(self, b: int):
        if b % self.rows_multiple:
            raise InvalidRequestError(
                f"a batch of {b} rows cannot be split over data={self.rows_multiple}: "
                f"give a multiple of {self.rows_multiple} rows"
            )

    def put_rows(self, x: np.ndarray):
        """Host rows [B, ...] -> a step's input, split over the devices as the rules say
        (``pmap``: reshaped to [devices, B / devices, ...])."""
        x = np.asarray(x)
        if self.strategy == "pmap":
            return x.reshape(len(self.devices), x.shape[0] // len(self.devices), *x.shape[1:])
        return put(x, self.sharding(TOKEN_AXES if x.ndim == 2 else ROW_AXES))

    def host_rows(self, x) -> np.ndarray:
        """A step's output -> host rows [B, ...] (every process sees all of them)."""
        if self.strategy == "pmap":
            a = np.asarray(x)
            return a.reshape(-1, *a.shape[2:])
        return to_host(x)

    def init_cache(self, batch: int, length: int) -> KVCache:
        """An empty cache for ``batch`` rows of ``length`` slots where the programs want it: the split view,
        created shard by shard (no device ever holds the whole cache); ``pmap``: one model-layout cache per
        device, stacked on a leading device axis."""
        if self.strategy == "pmap":
            n = len(self.devices)
            one = init_cache(self.config, batch // n, length, self.cache_dtype)
            return jax.tree.map(lambda a: jnp.stack([a] * n), one)
        shapes = split_cache_shapes(self.config, batch, length, self.cache_dtype)

        def empty():
            zeros = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)
            return dataclasses.replace(zeros, pos=jnp.full(shapes.pos.shape, -1, jnp.int32))  # -1: empty slot

        return jax.jit(empty, out_shardings=self._cache_sh)()

    def logits(self, tokens, positions) -> np.ndarray:
        """Full forward without a cache: tokens, positions [B, T] -> logits [B, T, V] (on the host).
        B must be a multiple of the data axis for the data-parallel strategies."""
        tokens, positions = np.asarray(tokens, np.int32), np.asarray(positions, np.int32)
        self.check_rows(tokens.shape[0])
        out, _ = self._call("logits", (self.params, self.put_rows(tokens), self.put_rows(positions)))
        return self.host_rows(out)

    def generate_results(
        self,
        prompts: Sequence[Sequence[int]],
        max_new_tokens: int = 32,
        *,
        tokenizer=None,
        ignore_eos: bool = False,
        stop: Sequence[str] = (),
        on_text: Callable[[int, str], None] | None = None,
        logprobs: bool = False,
        prefill: bool = True,
    ) -> list[GenerationResult]:
        """Greedy generation for prompts (lists of token ids) -> one
        :class:`~jaxlab.engine.generate.GenerationResult` per prompt, as the single-device
        :class:`~jaxlab.engine.generate.Generator` returns (EOS, stop strings and streaming need the same
        ``tokenizer``; its plan, so the tokens can be compared with it exactly).

        ``prefill=False`` feeds the prompt through the decode step one token per call: one compiled
        program instead of two (half the compile time, slower for long prompts)."""
        cfg = self.config
        prompts, rows = start_request(
            cfg,
            prompts,
            max_new_tokens,
            tokenizer,
            ignore_eos=ignore_eos,
            stop=stop,
            on_text=on_text,
            logprobs=logprobs,
        )
        shape = plan(cfg, [len(p) for p in prompts], max_new_tokens)
        return host_loop(self, cfg, prompts, max_new_tokens, rows, shape, prefill=prefill)

    # the placement host_loop steps (the Generator's loop, on this mesh)

    def prefill(self, tokens, positions, cache: KVCache):
        (nxt, last, cache), seconds = self._call(
            "prefill", (self.params, self.put_rows(tokens), self.put_rows(positions), cache)
        )
        return nxt, last, cache, seconds

    def decode(self, tokens, positions, cache: KVCache):
        if isinstance(tokens, np.ndarray):  # a prompt column (prefill=False); else the last step's tokens, in place
            tokens = self.put_rows(tokens)
        (nxt, last, cache), seconds = self._call("decode", (self.params, tokens, self.put_rows(positions), cache))
        return nxt, last, cache, seconds

    def host_tokens(self, nxt) -> np.ndarray:
        return self.host_rows(nxt)

    def host_logprobs(self, last, ids: np.ndarray) -> np.ndarray:
        return _token_logprobs(self.host_rows(last), ids)

    def prompt_done(self, last, rows: int) -> None:
        self._prompt = (last, rows)

    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        max_new_tokens: int = 32,
        *,
        ignore_eos: bool = False,
        prefill: bool = True,
    ) -> list[list[int]]:
        """Greedy generation -> the new token ids of each prompt (see :meth:`generate_results`); without
        ``ignore_eos`` each row ends before its first EOS."""
        results = self.generate_results(prompts, max_new_tokens, ignore_eos=ignore_eos, prefill=prefill)
        return [r.generated_ids for r in results]

    def prompt_logits(self) -> np.ndarray:
        """Logits [B, V] at each prompt's last position in the latest :meth:`generate` call (the
        prefill's output, which chose the first new token): for parity checks without another program."""
        if self._prompt is None:
            raise InvalidRequestError("call generate() first")
        last, n = self._prompt
        return self.host_rows(last)[:n]

    # -- the compiled decode step, for a shape ------------------------------------------------------

    def decode_args(self, batch: int | None = None, cache_len: int = 256) -> tuple:
        """Abstract arguments of the decode step for ``batch`` rows (default: the smallest batch the mesh
        takes) and ``cache_len`` slots: the signature of a real call, so no second compile."""
        batch = batch or (len(self.devices) if self.strategy == "pmap" else self.rows_multiple)
        self.check_rows(batch)
        if self.strategy == "pmap":
            n = len(self.devices)
            one = jax.eval_shape(lambda: init_cache(self.config, batch // n, cache_len, self.cache_dtype))
            cache = jax.tree.map(lambda s: jax.ShapeDtypeStruct((n, *s.shape), s.dtype), one)
            row = jax.ShapeDtypeStruct((n, batch // n), jnp.int32)
            return self.params, row, row, cache
        shapes = split_cache_shapes(self.config, batch, cache_len, self.cache_dtype)
        row = jax.ShapeDtypeStruct((batch,), jnp.int32, sharding=self.sharding(ROW_AXES))
        cache = jax.tree.map(lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh), shapes, self._cache_sh)
        return self.params, row, row, cache

    @property
    def decode_fn(self):
        """The decode step as a jitted (or pmapped) function, not yet compiled: ``decode_fn.lower(*decode_args(...))``
        compiles it for any devices the mesh holds, attached or not (``jaxlab compile``)."""
        return self._decode

    def decode_program(self, batch: int | None = None, cache_len: int = 256):
        """The compiled decode step for ``batch`` rows and ``cache_len`` slots: the program :meth:`generate`
        runs for that shape (``.as_text()`` is its optimized HLO). Called as
        ``program(params, tokens [B], positions [B], cache) -> (next tokens, logits, cache)``."""
        return self.programs.get("decode", self._decode, self.decode_args(batch, cache_len))[0]

    def decode_inputs(self, batch: int | None = None, cache_len: int = 256) -> tuple:
        """Concrete inputs for :meth:`decode_program`: (params, tokens, positions, a fresh cache)."""
        _, row, _, _ = self.decode_args(batch, cache_len)
        b = row.shape[0] * (row.shape[1] if self.strategy == "pmap" else 1)
        ones = self.put_rows(np.ones(b, np.int32))
        return self.params, ones, ones, self.init_cache(b, cache_len)

    def cache_shardings(self, batch: int, cache_len: int = 256) -> KVCache:
        """The shardings of a fresh split-view cache (what the rules say for K, V, pos, index)."""
        return jax.tree.map(lambda a: a.sharding, self.init_cache(batch, cache_len))

    def __repr__(self):
        return f"Sharded({self.config.name}, strategy={self.strategy}, mesh {format_mesh(self.shape)})"


def _token_logprobs(logits: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """log softmax(logits [B, V])[ids [B]] -> [B], on the host."""
    z = logits.astype(np.float64) - logits.max(axis=-1, keepdims=True)
    return (z[np.arange(len(ids)), ids] - np.log(np.exp(z).sum(axis=-1))).astype(np.float32)


def shard(
    params: Params,
    mesh: Mesh | str | Mapping[str, int] | None = None,
    strategy: str = "auto",
    rules: Mapping[str, str | None] | None = None,
    devices: Sequence | None = None,
    cache_dtype=None,
) -> Sharded:
    """Place ``params`` on ``mesh`` (a Mesh, ``"data=2,model=4"``, a dict, or None: fitted to the devices
    for ``strategy``) with one strategy: auto, data, tensor, data+tensor, shard_map, pmap. A mesh that is
    not a ``Mesh`` is built from ``devices`` (default ``jax.devices()``, e.g. :func:`mesh_devices`' ones).
    ``cache_dtype`` (default: the parameters' dtype) may be ``"int8"`` for the int8 KV cache."""
    if not isinstance(mesh, Mesh):
        if mesh is None:
            mesh = fit_mesh(
                "data+tensor" if strategy == "auto" else strategy, None if devices is None else len(devices)
            )
        mesh = make_mesh(mesh, devices)
    return Sharded(params, mesh, strategy, rules, cache_dtype)


def shard_generate(
    params: Params,
    prompts: Sequence[Sequence[int]],
    max_new_tokens: int = 32,
    mesh: Mesh | str | Mapping[str, int] | None = None,
    strategy: str = "auto",
    *,
    ignore_eos: bool = False,
    prefill: bool = True,
) -> list[list[int]]:
    """Greedy generation on a mesh -> the new token ids of each prompt (see :meth:`Sharded.generate`)."""
    return shard(params, mesh, strategy).generate(prompts, max_new_tokens, ignore_eos=ignore_eos, prefill=prefill)
