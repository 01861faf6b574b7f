"""Tools beside the engine: ``profile`` (timing that separates compiling from running, compile counting,
cost analysis, roofline, traces), ``compile_cache`` (the persistent compilation cache), ``program_export``
(``jax.export`` of the decode step, fresh-process measurements), ``reference`` (``transformers`` parity
and the golden files), ``hardware`` (chips, their published peaks, backend facts)."""
