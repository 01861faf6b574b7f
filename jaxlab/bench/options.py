"""What one ``jaxlab bench`` run measures and how much: the defaults, the ``--quick`` set, the command
line (:func:`add_arguments`) and the :class:`Options` every measured section is given
(:func:`resolve_options`)."""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass

from jaxlab.bench.llamaquant import resolve_llama_bench
from jaxlab.errors import InvalidRequestError
from jaxlab.quant import FORMATS as QUANT_FORMATS
from jaxlab.quant import KV_FORMATS

__all__ = ["DEFAULTS", "QUICK", "QUANT_FORMATS", "KV_FORMATS", "Options", "add_arguments", "resolve_options"]

#: The sizes of a full run (``jaxlab bench``); :data:`QUICK` is the smoke test's (``--quick``).
DEFAULTS = {
    "batch_sizes": (1, 8, 32, 128),
    "new_tokens": 128,
    "prompt_len": 128,
    "reps": 3,
    "bandwidth_mib": 1024,
    "matmul_n": 2048,
    "eager_steps": 8,
    "nocache_steps": 8,
    "bf16_steps": 16,
    "quant_batch_sizes": (1, 8, 32),
    "quant_steps": 16,
}
QUICK = {
    "batch_sizes": (1, 2),
    "new_tokens": 8,
    "prompt_len": 16,
    "reps": 1,
    "bandwidth_mib": 64,
    "matmul_n": 512,
    "eager_steps": 2,
    "nocache_steps": 2,
    "bf16_steps": 3,
    "quant_batch_sizes": (1, 2),
    "quant_steps": 3,
}


@dataclass(frozen=True)
class Options:
    """One run's settings. The first block are sizes (:data:`DEFAULTS`), the second what is measured;
    the field order is the order of ``"options"`` in the JSON report (:meth:`as_json`)."""

    batch_sizes: tuple[int, ...] = DEFAULTS["batch_sizes"]  # decode rows against the peer
    new_tokens: int = DEFAULTS["new_tokens"]  # tokens generated per row, EOS ignored
    prompt_len: int = DEFAULTS["prompt_len"]  # prompt tokens per row
    reps: int = DEFAULTS["reps"]  # repetitions of every timed measurement (median reported)
    bandwidth_mib: int = DEFAULTS["bandwidth_mib"]  # size of the copy that measures the bandwidth ceiling
    matmul_n: int = DEFAULTS["matmul_n"]  # n of the n x n matmul that measures the compute ceiling
    eager_steps: int = DEFAULTS["eager_steps"]  # decode steps timed per rep in the eager stage
    nocache_steps: int = DEFAULTS["nocache_steps"]  # ... in the jit-without-cache stage
    bf16_steps: int = DEFAULTS["bf16_steps"]  # ... in the bfloat16 stage
    quant_batch_sizes: tuple[int, ...] = DEFAULTS["quant_batch_sizes"]  # batches of the quantized rows
    quant_steps: int = DEFAULTS["quant_steps"]  # decode steps per timed measurement of the quantized rows

    quick: bool = False  # the --quick sizes (also: the small quality report, fewer speculative tokens)
    float: bool = True  # the float32 prefill/decode rows and everything measured against them
    peer: bool = True  # transformers beside the float32 rows
    ttft: bool = True  # time to first token in fresh child processes
    stages: bool = True  # decode at batch 1 five ways
    speculative: bool = True  # n-gram and draft-model drafting against plain greedy
    quant: bool = True  # the quantized decode rows
    quant_formats: tuple[str, ...] = QUANT_FORMATS  # weight formats of the quantized and quality rows
    quant_kv: tuple[str, ...] = KV_FORMATS  # KV-cache formats of the same
    quality: bool = False  # jaxlab.quant.quality's report on the same formats
    llama_bench: str | None = None  # llama.cpp's llama-bench beside the quantized rows (jaxlab.bench.llamaquant)
    model: str | None = None  # the model of every row (and the peer's); None: the embedded GGUF
    attention: str = "xla"  # the float32 rows' attention: "xla" or "pallas" (the kernels; interpret mode on a CPU)
    targets: bool = False  # print the targets as PASS/MISS lines
    json: str | None = None  # write every number to this file
    plot: str | None = None  # write the roofline plot to this file

    @property
    def model_options(self):
        """The model of the float32 rows and the stages as a :class:`jaxlab.engine.loading.ModelOptions` (the
        options ``jaxlab generate`` loads with): float32 on every backend (bfloat16 is its own stage), with
        :attr:`attention`."""
        from jaxlab.engine.loading import ModelOptions

        return ModelOptions(model=self.model, dtype="float32", attention=self.attention)

    def as_json(self) -> dict:
        """The options as the JSON report stores them (tuples as lists)."""
        out = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            out[f.name] = list(value) if isinstance(value, tuple) else value
        return out


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``jaxlab bench`` (called by :mod:`jaxlab.cli`)."""
    d = DEFAULTS
    parser.add_argument(
        "--batch-sizes",
        type=int_list,
        default=None,
        metavar="B,B,...",
        help=f"decode batch sizes (default {','.join(map(str, d['batch_sizes']))})",
    )
    parser.add_argument(
        "--new-tokens",
        type=int,
        default=None,
        metavar="N",
        help=f"tokens generated per row, EOS ignored (default {d['new_tokens']})",
    )
    parser.add_argument(
        "--prompt-len", type=int, default=None, metavar="T", help=f"prompt tokens per row (default {d['prompt_len']})"
    )
    parser.add_argument(
        "--reps",
        type=int,
        default=None,
        metavar="R",
        help=f"repetitions of every timed measurement; the median is reported (default {d['reps']})",
    )
    parser.add_argument(
        "--bandwidth-mib",
        type=int,
        default=None,
        metavar="MIB",
        help=f"size of the copy that measures the bandwidth ceiling (default {d['bandwidth_mib']})",
    )
    parser.add_argument(
        "--matmul-n",
        type=int,
        default=None,
        metavar="N",
        help=f"size of the n x n float32 matmul that measures the compute ceiling (default {d['matmul_n']})",
    )
    parser.add_argument("--no-peer", action="store_true", help="skip the transformers (PyTorch) comparison")
    parser.add_argument("--no-ttft", action="store_true", help="skip the time-to-first-token child processes")
    parser.add_argument(
        "--stages",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="measure the decode stages: eager, jit without cache, jit + cache, on device, bfloat16",
    )
    parser.add_argument(
        "--speculative",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="measure speculative decoding (n-gram and draft model) against plain greedy by task type",
    )
    parser.add_argument(
        "--quant",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="measure the quantized decode step: float32 and each --quant-formats, each with each "
        "--quant-kv cache, at --quant-batch-sizes, side by side in this process",
    )
    parser.add_argument(
        "--llama-bench",
        default=None,
        metavar="PATH|auto|none",
        help="with --quant: also time llama.cpp's token generation on F32, Q8_0 and Q4_1 GGUFs of the same model "
        "(auto: the llama-bench `make llama-cpp` built) and print what quantization buys in each stack",
    )
    parser.add_argument(
        "--quant-batch-sizes",
        type=int_list,
        default=None,
        metavar="B,B,...",
        help=f"batch sizes of the quantized decode rows (default {','.join(map(str, d['quant_batch_sizes']))})",
    )
    parser.add_argument(
        "--quant-steps",
        type=int,
        default=None,
        metavar="N",
        help=f"decode steps per timed measurement of the quantized rows (default {d['quant_steps']})",
    )
    parser.add_argument(
        "--quant-formats",
        type=choices(QUANT_FORMATS),
        default=QUANT_FORMATS,
        metavar="F,F,...",
        help=f"weight formats of the quantization and quality rows (default {','.join(QUANT_FORMATS)})",
    )
    parser.add_argument(
        "--quant-kv",
        type=choices(KV_FORMATS),
        default=KV_FORMATS,
        metavar="KV,KV",
        help=f"KV cache formats of the quantization and quality rows (default {','.join(KV_FORMATS)})",
    )
    parser.add_argument(
        "--quality",
        action="store_true",
        help="quality of each format against float32: perplexity on data/eval, KL, top-1 and greedy "
        "agreement over 32 chat prompts, memory (about 5 minutes on 2 cores)",
    )
    parser.add_argument(
        "--quant-only",
        action="store_true",
        help="only the quantization rows (and --quality): skip prefill, the float32 decode rows, the "
        "peer, the stages, speculative decoding and time to first token",
    )
    parser.add_argument(
        "--model",
        default=None,
        help="the model to measure, quantize and evaluate (a .gguf file, a HF checkpoint folder or hub id; the "
        "peer loads the same; default: the embedded SmolLM2-135M; needs --no-ttft)",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="tiny sizes for a smoke test: batch 1,2, 8 new tokens, prompt 16, 1 rep, small ceilings "
        "and a small quality report",
    )
    parser.add_argument(
        "--trace",
        action="store_true",
        help="only continuous batching: a seeded 64-request trace served by static and continuous batching, the "
        "paged decode step against the contiguous one, prefix reuse (about 10 minutes on 2 cores; --quick: seconds)",
    )
    parser.add_argument(
        "--serve",
        action="store_true",
        help="only serving: `jaxlab serve` under 1, 8, 32, 64 concurrent streaming clients beside llama.cpp's "
        "llama-server (built by `make llama-cpp`), same GGUF, prompts and max_tokens (about 10 minutes on 2 cores)",
    )
    parser.add_argument(
        "--concurrency", type=int_list, default=None, metavar="C,C,...", help="with --serve: client counts (1,8,32,64)"
    )
    parser.add_argument(
        "--requests-per-client", type=int, default=None, metavar="R", help="with --serve: requests per client (2)"
    )
    parser.add_argument(
        "--serve-slots", type=int, default=None, metavar="S", help="with --serve: slots per server (32)"
    )
    parser.add_argument(
        "--serve-quant",
        choices=QUANT_FORMATS + ("none",),
        default=None,
        help="with --serve: jaxlab serve's weight format (default int8, the fastest that passes the quality report)",
    )
    parser.add_argument(
        "--serve-kv", choices=KV_FORMATS, default=None, help="with --serve: jaxlab serve's KV cache (default int8)"
    )
    parser.add_argument(
        "--serve-no-overlap",
        action="store_true",
        help="with --serve: run jaxlab serve --no-overlap (each decode step waits for the last one's tokens)",
    )
    parser.add_argument(
        "--llama-server",
        default=None,
        metavar="PATH",
        help="with --serve: the peer's llama-server (default: the one `make llama-cpp` built; 'none': no peer)",
    )
    parser.add_argument(
        "--encoder",
        action="store_true",
        help="only the sentence encoder: jaxlab's jitted all-MiniLM-L6-v2 against PyTorch eager and torch.compile, "
        "batch 1/32/128 x length 32/128, and the verdict on 'JAX BERT is 2-3x faster' (needs torch)",
    )
    parser.add_argument("--no-torch-compile", action="store_true", help="with --encoder: skip torch.compile")
    parser.add_argument(
        "--kernels",
        action="store_true",
        help="only the Pallas attention kernels against jitted jnp attention and JAX's own kernels, context "
        "512/2k/8k x batch 1/8/32 (a GPU or TPU; on a CPU a small interpret-mode check)",
    )
    parser.add_argument(
        "--retrieval",
        action="store_true",
        help="only retrieval: the docs corpus and its dense index, dense vs BM25 on the question set, answers with "
        "and without retrieved passages",
    )
    parser.add_argument("--no-rag", action="store_true", help="with --retrieval: skip the answers (the LLM)")
    parser.add_argument(
        "--train",
        action="store_true",
        help="only training: LoRA vs full fine-tune, with and without remat: tokens/s, MFU against the measured "
        "matmul ceiling, the step's temporary memory",
    )
    parser.add_argument(
        "--structured",
        action="store_true",
        help="only structured output: the extraction task's test split with and without its JSON schema "
        "(schema-valid, match and field-exact %%; a LoRA adapter too with --adapter), and the masked decode step "
        "against the free one at batch 1 and 32 (about 12 minutes on 2 cores; --limit N items for less)",
    )
    parser.add_argument(
        "--limit", type=int, default=None, metavar="N", help="with --structured: the first N test items (250)"
    )
    parser.add_argument(
        "--adapter", default=None, metavar="DIR", help="with --structured: a LoRA adapter from `jaxlab finetune`"
    )
    parser.add_argument(
        "--attention",
        choices=("xla", "pallas"),
        default="xla",
        help="the float32 rows' attention: xla (default) or pallas (the lab's kernels; on a CPU in interpret mode, "
        "a simulator: correct, not fast)",
    )
    parser.add_argument("--targets", action="store_true", help="print the issue's targets as PASS/MISS lines")
    parser.add_argument("--json", metavar="PATH", default=None, help="write every number to this JSON file")
    parser.add_argument("--plot", metavar="PATH", default=None, help="write a roofline plot (PNG) to this file")


def int_list(text: str) -> tuple[int, ...]:
    """argparse type: "32,1,8" -> (32, 1, 8), every value >= 1."""
    try:
        values = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated whole numbers, got {text!r}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"batch sizes must be >= 1, got {text!r}")
    return values


def choices(allowed: tuple[str, ...]):
    """argparse type: a comma-separated subset of ``allowed``, duplicates dropped, order kept."""

    def parse(text: str) -> tuple[str, ...]:
        values = tuple(dict.fromkeys(x.strip() for x in text.split(",") if x.strip()))
        bad = [v for v in values if v not in allowed]
        if not values or bad:
            raise argparse.ArgumentTypeError(f"expected a comma-separated subset of {','.join(allowed)}, got {text!r}")
        return values

    return parse


def resolve_options(args: argparse.Namespace) -> Options:
    """Defaults (or the --quick set), overridden by whatever was given explicitly, checked."""
    quick = bool(getattr(args, "quick", False))
    sizes = dict(QUICK if quick else DEFAULTS)
    for key in sizes:
        value = getattr(args, key, None)
        if value is not None:
            sizes[key] = value
    sizes["batch_sizes"] = tuple(sorted(set(sizes["batch_sizes"])))
    sizes["quant_batch_sizes"] = tuple(sorted(set(sizes["quant_batch_sizes"])))
    quant_only = bool(getattr(args, "quant_only", False))
    opts = Options(
        **sizes,
        quick=quick,
        float=not quant_only,
        peer=not getattr(args, "no_peer", False) and not quant_only,
        ttft=not getattr(args, "no_ttft", False) and not quant_only,
        stages=bool(getattr(args, "stages", True)) and not quant_only,
        speculative=bool(getattr(args, "speculative", True)) and not quant_only,
        quant=bool(getattr(args, "quant", True)),
        quant_formats=tuple(getattr(args, "quant_formats", None) or QUANT_FORMATS),
        quant_kv=tuple(getattr(args, "quant_kv", None) or KV_FORMATS),
        quality=bool(getattr(args, "quality", False)),
        llama_bench=resolve_llama_bench(getattr(args, "llama_bench", None)),
        model=getattr(args, "model", None),
        attention=getattr(args, "attention", None) or "xla",
        targets=bool(getattr(args, "targets", False)),
        json=getattr(args, "json", None),
        plot=getattr(args, "plot", None),
    )

    opts.model_options.check()  # the model flags' own rules, as every face checks them
    if opts.model is not None and opts.ttft:
        raise InvalidRequestError(
            "time to first token is measured on the embedded model in fresh processes; add --no-ttft with --model"
        )
    if quant_only and not (opts.quant or opts.quality):
        raise InvalidRequestError(
            "--quant-only with --no-quant and without --quality measures nothing; drop --no-quant or add --quality"
        )
    if quant_only and opts.plot:
        raise InvalidRequestError("--plot draws the float32 prefill and decode roofline; drop --plot or --quant-only")
    if opts.quant_steps < 1:
        raise InvalidRequestError(f"--quant-steps must be >= 1, got {opts.quant_steps}")
    for key in ("new_tokens", "prompt_len", "reps", "bandwidth_mib", "matmul_n"):
        if getattr(opts, key) < 1:
            raise InvalidRequestError(f"--{key.replace('_', '-')} must be >= 1, got {getattr(opts, key)}")
    if opts.new_tokens < 2:
        raise InvalidRequestError("--new-tokens must be >= 2 (decode speed needs at least one decode step)")
    return opts
