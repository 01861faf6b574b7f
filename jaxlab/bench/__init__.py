"""``jaxlab bench``: prefill and decode speed of the embedded SmolLM2-135M, as ratios measured in one run.

Absolute tokens/s depend on the machine and on whatever else it is doing, so every headline number here
is a *ratio* of two things measured side by side in the same process, minutes apart:

* against this machine's own **ceilings**, measured in the same run: memory bandwidth (read + write
  bytes of a >= 1 GiB copy, :func:`jaxlab.tools.profile.measure_bandwidth`) and float32 matmul FLOP/s
  (:func:`jaxlab.tools.profile.measure_matmul_flops`; a bfloat16 matmul is measured beside it);
* on a known accelerator, also against the chip's **published peaks** (:mod:`jaxlab.tools.hardware`: bfloat16
  dense FLOP/s and memory bandwidth from the vendor's pages), each figure as % of both;
* against a **peer**: Hugging Face ``transformers`` (PyTorch eager, float32, CPU) running ``generate``
  on the same GGUF weights, the same prompts and batch sizes, greedy, EOS ignored; its greedy tokens are
  compared with ours row by row.

Quantization (``jaxlab.quant``): the decode step of each weight format x KV-cache format against float32,
all measured side by side in one process (:func:`~jaxlab.bench.quantrows.measure_quant`), with where each
format starts to pay (:func:`~jaxlab.bench.quantrows.crossover`); ``--quality`` adds
:func:`jaxlab.quant.quality.quality_report` (perplexity, KL, greedy agreement, memory), and ``--targets``
says whether the format that meets a speed target also meets the quality targets. ``--quant-only``
measures only these.

Method: every timed quantity is measured ``--reps`` times after a warm-up (compiled programs, touched
memory) and reported as the median with the min-max spread; every JAX timing ends with a host transfer
or ``block_until_ready``. Time to first token runs in fresh child processes with an empty (cold) and
then a filled (warm) persistent compilation cache, before this process starts its own backend (a TPU
belongs to one process: a child started later would measure the CPU; if it did, the figure says so).
See ``benchmarks/README.md``.

The package, one job per module:

* :mod:`~jaxlab.bench.options` — defaults, the ``--quick`` set, the command line, :class:`Options`;
* :mod:`~jaxlab.bench.costmodel` — FLOPs and bytes per step, the measured ceilings, roofline percentages;
* :mod:`~jaxlab.bench.harness` — the run's :class:`~jaxlab.bench.harness.Setup`, a compile-logging
  generator, progress log, host facts; :mod:`~jaxlab.bench.stats` — medians, spreads, token comparisons;
  :mod:`~jaxlab.bench.prompts` — the fixed text the prompts are cut from;
* :mod:`~jaxlab.bench.peer` — transformers, the peer;
* the measured sections: :mod:`~jaxlab.bench.speed` (prefill and decode against the peer),
  :mod:`~jaxlab.bench.stages`, :mod:`~jaxlab.bench.speculative`, :mod:`~jaxlab.bench.ttft` (fresh
  processes), :mod:`~jaxlab.bench.quantrows`, :mod:`~jaxlab.bench.memory`;
* :mod:`~jaxlab.bench.targets` — headline numbers against the issue's thresholds;
* :mod:`~jaxlab.bench.report`, :mod:`~jaxlab.bench.quantreport`, :mod:`~jaxlab.bench.fmt` — the text
  report; :mod:`~jaxlab.bench.output` — the JSON file and the roofline plot;
* :mod:`~jaxlab.bench.run` — one run start to end, and the ``jaxlab bench`` command.

The pure helpers need no model and are unit-tested (tests/bench). torch and transformers are imported
only when the peer runs, matplotlib only when the plot is drawn.
"""

from jaxlab.bench.options import Options, add_arguments, resolve_options
from jaxlab.bench.report import render
from jaxlab.bench.run import run_bench, run_from_args
from jaxlab.bench.ttft import child_main

__all__ = ["Options", "add_arguments", "resolve_options", "run_bench", "run_from_args", "render", "child_main"]
