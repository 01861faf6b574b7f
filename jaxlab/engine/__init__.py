"""The engine: the model and everything that runs it.

``config`` (a frozen ``LlamaConfig`` with presets) → ``model`` (Flax NNX modules and the one pure
``forward(params, tokens, positions, cache)``, with hooks for tensor parallelism and early exit) with
``kvcache`` (the cache as an explicit pytree) and ``sampling`` (one ``Sampling`` pytree) beside it →
the step toolkit: ``plan`` (request checks, bucketed shapes), ``programs`` (the compiled-program
cache) and ``steps`` (the jitted prefill / decode / verify steps) → the loops built from it:
``generate`` (``Generator``, ``decode_on_device``), ``speculative``, ``sharding`` (meshes and the
parallel strategies), ``distributed`` (multi-process runs); ``loading`` is the one door from files
(``jaxlab.io``) to parameters. The engine imports nothing from ``lab``, ``bench`` or the faces
(``cli``); tests/house/test_structure.py keeps it so.
"""
