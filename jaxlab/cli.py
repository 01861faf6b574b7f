"""The ``jaxlab`` command: ``generate``, ``chat``, ``serve``, ``embed``, ``ask``, ``info``, ``fetch``, ``export``,
``bench``.

Every problem the user can cause ends with one line on stderr and a non-zero exit status, never a
traceback (set ``JAXLAB_DEBUG=1`` to see one anyway).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import warnings

from jaxlab.errors import FallbackWarning, InvalidRequestError, JaxlabError
from jaxlab.quant import DEFAULT_GROUP, FORMATS, KV_FORMATS

CHAT_CONTEXT = 2048  # positions a chat holds (history and reply); /reset starts over
EXIT_USER_ERROR = 1
EXIT_USAGE = 2
EXIT_INTERNAL = 3
ATTENTION_HELP = "xla (default: jnp, compiled by XLA) or pallas (the lab's Pallas kernels; interpret mode on a CPU)"


class _Parser(argparse.ArgumentParser):
    """argparse that reports a usage error on one line."""

    def error(self, message):
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see `{self.prog} --help`)\n")


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="jaxlab", description="A JAX LLM-inference lab on a real pretrained model.")
    sub = p.add_subparsers(dest="command", parser_class=_Parser, required=True)

    def model_opts(sp):
        sp.add_argument(
            "--model",
            default=None,
            help="embedded name (smollm2-135m, default), a .gguf file, a HF checkpoint folder or hub id",
        )
        sp.add_argument(
            "--dtype",
            default="auto",
            help="auto (default: float32 on a CPU or a GPU older than sm 80, bfloat16 on TPU and "
            "newer GPUs; float32 with --quant), float32 or bfloat16",
        )
        sp.add_argument(
            "--quant",
            choices=FORMATS,
            default=None,
            help="quantize the weights (quantized once, then cached): int8 or int4 weight-only, "
            "or w8a8 (int8 weights and activations); computes in float32 on every backend",
        )
        sp.add_argument(
            "--group-size",
            type=int,
            default=None,
            metavar="N",
            help=f"with --quant int4: inputs per scale and offset (default {DEFAULT_GROUP})",
        )
        sp.add_argument(
            "--kv-cache",
            choices=KV_FORMATS,
            default=None,
            help="KV cache format: float32 or int8 (default: the --dtype)",
        )
        sp.add_argument("--attention", choices=("xla", "pallas"), default="xla", help=ATTENTION_HELP)

    def sampling_opts(sp):
        sp.add_argument("--max-new-tokens", type=int, default=128, metavar="N")
        sp.add_argument("--temperature", type=float, default=None, help="0 or unset = greedy")
        sp.add_argument("--top-k", type=int, default=0)
        sp.add_argument("--top-p", type=float, default=1.0)
        sp.add_argument("--min-p", type=float, default=0.0)
        sp.add_argument("--seed", type=int, default=0)
        sp.add_argument("--stop", action="append", default=[], metavar="STR", help="stop string (repeatable)")
        sp.add_argument("--ignore-eos", action="store_true")

    g = sub.add_parser("generate", help="generate a reply for each prompt (one batch)")
    g.add_argument("prompts", nargs="+", metavar="PROMPT")
    g.add_argument("--raw", action="store_true", help="send the prompt as is, without the chat template")
    g.add_argument("--json", action="store_true", help="one JSON object per prompt per line")
    g.add_argument(
        "--mesh",
        default=None,
        metavar="SPEC",
        help="run sharded on a device mesh, e.g. data=2,model=4 (greedy only; on a CPU set "
        "XLA_FLAGS=--xla_force_host_platform_device_count=N first)",
    )
    g.add_argument("--strategy", default="auto", help="with --mesh: auto, data, tensor, data+tensor, shard_map or pmap")
    g.add_argument(
        "--speculative",
        choices=("ngram", "draft"),
        default=None,
        help="speculative decoding: n-gram prompt lookup or a draft model of the first layers",
    )
    g.add_argument("--draft-k", type=int, default=4, metavar="K", help="draft tokens verified per call (default 4)")
    g.add_argument("--draft-layers", type=int, default=8, metavar="L", help="layers of the draft model (default 8)")
    g.add_argument("--adapter", default=None, metavar="DIR", help="a LoRA adapter from `jaxlab finetune`, merged in")
    so = g.add_argument_group("structured output (one of; the reply ends when the grammar is complete)")
    so.add_argument("--json-schema", default=None, metavar="FILE", help="the reply is JSON matching this JSON schema")
    so.add_argument("--regex", default=None, metavar="RE", help="the reply matches this regex (Rust regex syntax)")
    so.add_argument("--choice", default=None, metavar="A,B,C", help="the reply is one of these comma-separated strings")
    model_opts(g)
    sampling_opts(g)

    t = sub.add_parser("finetune", help="train a LoRA adapter on prompt/answer pairs (JSONL), with optax")
    from jaxlab.train import command

    command.add_arguments(t)
    from jaxlab.bench import chip_compile

    chip_compile.add_arguments(
        sub.add_parser("compile", help="compile every program the lab runs for a TPU (or this CPU), with no chip here")
    )
    from jaxlab.lab import checking

    checking.add_arguments(sub.add_parser("check", help="run a saved notebook's exercises through their checks"))
    from jaxlab.lab import verdicts

    verdicts.add_arguments(
        sub.add_parser("verdicts", help="every claim's verdict from your saved notebooks, side by side (the wrap-up)")
    )

    c = sub.add_parser("chat", help="interactive chat with history and streamed output")
    c.add_argument("--system", default=None, help="system message")
    model_opts(c)
    sampling_opts(c)

    s = sub.add_parser("serve", help="an OpenAI-compatible HTTP server with a chat page (continuous batching)")
    s.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    s.add_argument("--port", type=int, default=8000)
    s.add_argument("--max-batch", type=int, default=8, metavar="N", help="rows of one decode call (default 8)")
    s.add_argument(
        "--max-running", type=int, default=64, metavar="N", help="requests running at once, memory allowing (64)"
    )
    s.add_argument(
        "--kv-tokens", type=int, default=None, metavar="N", help="KV memory in positions (default max-batch x context)"
    )
    s.add_argument(
        "--kv-memory", type=float, default=None, metavar="F", help="KV memory as a fraction of the free memory"
    )
    s.add_argument(
        "--context", type=int, default=CHAT_CONTEXT, metavar="N", help=f"positions per request (default {CHAT_CONTEXT})"
    )
    s.add_argument(
        "--speculative",
        choices=("ngram",),
        default=None,
        help="speculative decoding on the engine: each greedy request carries its own prompt-lookup drafts per step",
    )
    s.add_argument("--draft-k", type=int, default=4, metavar="K", help="draft tokens per request and step (default 4)")
    s.add_argument(
        "--no-overlap",
        dest="overlap",
        action="store_false",
        help="wait for each decode step's tokens before launching the next (default: launch it a step early, so the "
        "host's work overlaps the device's; the tokens are the same)",
    )
    s.add_argument(
        "--api-key",
        default=os.environ.get("JAXLAB_API_KEY"),
        metavar="KEY",
        help="require 'Authorization: Bearer KEY' (default: $JAXLAB_API_KEY; unset = no key)",
    )
    s.add_argument("--rate-limit", type=float, default=None, metavar="N", help="requests per minute per key (off)")
    s.add_argument("--max-body-bytes", type=int, default=1 << 20, metavar="N", help="largest request body (1 MiB)")
    s.add_argument("--request-timeout", type=float, default=600.0, metavar="S", help="answer 504 after S seconds")
    s.add_argument("--served-model-name", default=None, metavar="NAME", help="the model's id in the API")
    s.add_argument("--grace", type=float, default=10.0, metavar="S", help="after SIGTERM, in-flight requests get S s")
    s.add_argument(
        "--allowed-hosts",
        default="",
        metavar="NAMES",
        help="Host names answered besides localhost/127.0.0.1/::1 and --host, comma-separated ('*': any)",
    )
    s.add_argument("--cors", default="", metavar="ORIGINS", help="origins whose pages may call the server ('*': any)")
    s.add_argument("--open-metrics", action="store_true", help="serve /metrics without the API key")
    s.add_argument(
        "--max-queue", type=int, default=256, metavar="N", help="requests admitted at once; more are answered 503"
    )
    s.add_argument("--body-timeout", type=float, default=10.0, metavar="S", help="answer 408 if a body takes > S s")
    model_opts(s)

    e = sub.add_parser("embed", help="sentence embeddings (all-MiniLM-L6-v2, 384 floats, unit length)")
    e.add_argument("texts", nargs="*", metavar="TEXT")
    e.add_argument("--file", default=None, metavar="F", help="also embed every line of this UTF-8 file ('-': stdin)")
    e.add_argument("--json", action="store_true", help='one line per text: {"text": ..., "embedding": [384 floats]}')
    e.add_argument("--batch-size", type=int, default=32, metavar="N", help="texts per compiled batch (default 32)")

    a = sub.add_parser("ask", help="answer a question about JAX, Flax or NumPy from their docs (retrieval + SmolLM2)")
    a.add_argument("question", metavar="QUESTION")
    a.add_argument("-k", type=int, default=3, help="passages retrieved (default 3)")
    a.add_argument("--no-retrieval", action="store_true", help="ask the model alone, without passages")
    a.add_argument("--max-new-tokens", type=int, default=128, metavar="N")

    i = sub.add_parser(
        "info", help="versions, devices, the chip and its published peaks, matmul precision, model path, cache folders"
    )
    i.add_argument("--json", action="store_true")

    f = sub.add_parser("fetch", help="fetch, verify and convert the embedded model (run by make)")
    f.add_argument("--model", default="smollm2-135m")

    x = sub.add_parser("export", help="write the model as a Hugging Face folder or a GGUF file (with its tokenizer)")
    x.add_argument("--format", required=True, choices=("hf", "gguf"))
    x.add_argument("--out", required=True, metavar="PATH", help="the folder (hf) or the .gguf file (gguf) to write")
    x.add_argument("--qtype", choices=("F32", "F16", "Q8_0"), default=None, help="gguf: matrix type (default F16)")
    x.add_argument("--dtype", choices=("float32", "float16", "bfloat16"), default=None, help="hf (default float32)")
    x.add_argument("--model", default=None, help="embedded name (default), a .gguf file or a HF checkpoint folder")
    x.add_argument("--overwrite", action="store_true", help="replace an existing file, or write into a full folder")
    x.add_argument("--adapter", default=None, metavar="DIR", help="a LoRA adapter from `jaxlab finetune`, merged in")

    b = sub.add_parser("bench", help="measure prefill/decode speed against the roofline and transformers")
    from jaxlab import bench

    bench.add_arguments(b)
    return p


def _sampling(args):
    from jaxlab.engine.sampling import SamplingParams

    if args.max_new_tokens < 1:
        raise InvalidRequestError(f"--max-new-tokens must be >= 1, got {args.max_new_tokens}")
    return SamplingParams(temperature=args.temperature or 0.0, top_k=args.top_k, top_p=args.top_p, min_p=args.min_p)


def _model_options(args):
    """The model flags of ``args`` as one :class:`~jaxlab.engine.loading.ModelOptions`, checked. Where --quant
    loads float32 although the backend's default is another dtype, one line on stderr says so, before the rules
    that read the resolved dtype (a KV cache unlike the parameters) can stop the command."""
    from jaxlab.engine.loading import ModelOptions

    weights = ModelOptions(dtype=args.dtype, quant=args.quant, group_size=args.group_size)
    note = weights.dtype_note()
    if note:
        sys.stderr.write(f"jaxlab: {note}\n")
    return weights.replace(
        model=args.model,
        kv_cache=args.kv_cache,
        attention=args.attention,
        adapter=getattr(args, "adapter", None),
        mesh=getattr(args, "mesh", None),
        speculative=getattr(args, "speculative", None),
        draft_k=getattr(args, "draft_k", 4),
    )


def _computes_in(params) -> str:
    """What the model computes in, for --json: the dtype, or a quantized format's description."""
    from jaxlab.quant import COMPUTES_IN

    return COMPUTES_IN[params.quant] if params.quant else f"{params.policy.dtype} activations"


def _load(options):
    """The model ``options`` ask for, with its adapter merged in; progress bars only where someone watches."""
    from jaxlab.engine.loading import load_model
    from jaxlab.tools import compile_cache

    compile_cache.enable()
    m = load_model(options, progress=sys.stderr.isatty())
    if options.adapter:  # merged into the float weights; merging keeps their policy, --attention included
        m = _with_adapter(m, options.adapter)
    return m


def _with_adapter(m, folder):
    """The model with a LoRA adapter folder merged into its weights (a clear error if it does not fit)."""
    import dataclasses

    from jaxlab.train import lora

    return dataclasses.replace(m, params=lora.merge_folder(m.params, folder))


def _engine(options, m, slots: int, context: int):
    """The continuous-batching engine (jaxlab.engine.continuous) for ``slots`` sequences of up to ``context``
    positions; the page pool holds exactly that much."""
    from jaxlab.engine.continuous import Engine

    return Engine(m.params, m.tokenizer, slots=slots, context=context, cache_dtype=options.cache_dtype)


def cmd_generate(args, out=None):
    out = out or sys.stdout
    sampling = _sampling(args)
    options = _model_options(args)
    from jaxlab.engine.grammar import from_options
    from jaxlab.io.tokenizer import prompt_ids

    constraint = from_options(args.json_schema, args.regex, args.choice)
    if constraint is not None and (args.mesh or args.speculative):
        raise InvalidRequestError(
            f"--{constraint.kind.replace('_', '-')} runs on the engine: drop --{'mesh' if args.mesh else 'speculative'}"
        )

    m = _load(options)
    tok = m.tokenizer
    ids = [prompt_ids(tok, p, raw=args.raw) for p in args.prompts]
    streaming = len(ids) == 1 and not args.json

    def on_text(_row, piece):
        out.write(piece)
        out.flush()

    if args.mesh:
        results = _generate_on_mesh(args, m, ids, sampling)
    elif args.speculative:
        results = _generate_speculative(args, m, ids, sampling)
    else:
        from jaxlab.engine.plan import check_generation

        requests = [  # the one check every face shares; the engine takes the requests as they are
            check_generation(
                p,
                args.max_new_tokens,
                vocab_size=m.config.vocab_size,
                context=m.config.max_seq_len,
                sampling=sampling,
                seed=args.seed + i,
                stop=args.stop,
                ignore_eos=args.ignore_eos,
                constraint=constraint,
            )
            for i, p in enumerate(ids)
        ]
        context = max(len(p) for p in ids) + args.max_new_tokens
        engine = _engine(options, m, slots=len(ids), context=context)
        results = engine.generate(requests, on_text=on_text if streaming else None)
    for prompt, r in zip(args.prompts, results):
        if args.json:
            out.write(
                json.dumps(
                    {
                        "prompt": prompt.encode("utf-8", "surrogateescape").decode("utf-8", "replace"),
                        "prompt_ids": r.prompt_ids,
                        "generated_ids": r.generated_ids,
                        "text": r.text,
                        "finish_reason": r.finish_reason,
                        "prefill_seconds": round(r.prefill_seconds, 6),
                        "decode_seconds": round(r.decode_seconds, 6),
                        "compile_seconds": round(r.compile_seconds, 6),
                        "quant": m.params.quant,
                        "kv_cache": options.cache_dtype.name,
                        "dtype": m.params.policy.dtype,
                        "computes_in": _computes_in(m.params),
                    },
                    ensure_ascii=False,
                )
                + "\n"
            )
        elif streaming:
            out.write("\n")
        else:
            out.write(f"### {prompt}\n{r.text}\n\n")
    return 0


def _generate_on_mesh(args, m, ids, sampling):
    """Greedy generation sharded over a device mesh (jaxlab.engine.sharding); results shaped like Generator's
    (the same TextStops bookkeeping: EOS, stop strings)."""
    from jaxlab.engine.mesh import make_mesh
    from jaxlab.engine.sampling import SamplingParams
    from jaxlab.engine.sharding import shard

    if sampling != SamplingParams():
        raise InvalidRequestError("--mesh generates greedily: drop --temperature/--top-k/--top-p/--min-p")
    sharded = shard(m.params, make_mesh(args.mesh), args.strategy)
    return sharded.generate_results(
        ids, args.max_new_tokens, tokenizer=m.tokenizer, ignore_eos=args.ignore_eos, stop=args.stop
    )


def _generate_speculative(args, m, ids, sampling):
    """Speculative decoding (jaxlab.engine.speculative): same tokens as plain greedy, fewer model calls."""
    from jaxlab.engine.speculative import speculative_generate

    rows = speculative_generate(
        m.params,
        ids,
        args.max_new_tokens,
        method=args.speculative,
        k=args.draft_k,
        draft_layers=args.draft_layers,
        tokenizer=m.tokenizer,
        ignore_eos=args.ignore_eos,
        sampling=None if sampling.greedy else sampling,
        seed=args.seed,
        stop=args.stop,
    )
    return rows  # SpecResult is a GenerationResult


def cmd_chat(args, stdin=None, out=None):
    from jaxlab.io.tokenizer import prompt_ids

    stdin, out = stdin or sys.stdin, out or sys.stdout
    sampling = _sampling(args)
    options = _model_options(args)
    m = _load(options)
    tok = m.tokenizer
    # one sequence; each turn's prompt starts with the conversation so far, whose full pages are read back
    # from the prefix table instead of computed again
    engine = _engine(options, m, slots=1, context=min(m.config.max_seq_len, CHAT_CONTEXT))
    history = []

    def show(_row, piece):
        out.write(piece)
        out.flush()

    if args.system:
        history.append({"role": "system", "content": args.system})
    out.write("jaxlab chat: type a message; /reset clears the history, /exit or Ctrl-D quits.\n")
    while True:
        out.write("> ")
        out.flush()
        line = stdin.readline()
        if not line:
            out.write("\n")
            return 0
        text = line.rstrip("\n")
        if text.strip() in ("/exit", "/quit"):
            return 0
        if text.strip() == "/reset":
            history = history[:1] if args.system else []
            out.write("(history cleared)\n")
            continue
        if not text.strip():
            continue
        ids = prompt_ids(tok, text, messages=history)
        room = engine.context - len(ids)
        if room < 1:
            out.write("(the conversation no longer fits in the context: /reset to start over)\n")
            continue
        (r,) = engine.generate(
            [ids],
            min(args.max_new_tokens, room),
            sampling,
            seed=args.seed,
            stop=args.stop,
            ignore_eos=args.ignore_eos,
            on_text=show,
        )
        out.write("\n")
        history += [{"role": "user", "content": text}, {"role": "assistant", "content": r.text}]


def cmd_info(args, out=None):
    from jaxlab.tools.about import format_info, info

    out = out or sys.stdout
    d = info()
    out.write(json.dumps(d, indent=2) + "\n" if args.json else format_info(d))
    return 0


def cmd_fetch(args, out=None):
    out = out or sys.stdout
    from jaxlab.engine.loading import load_params
    from jaxlab.io import assets

    t0 = time.perf_counter()
    path = assets.model_path(args.model, download=True)
    out.write(f"model: {path} (sha256 verified)\n")
    params, _, _ = load_params(args.model, progress=True)
    out.write(f"parameters: {params!r}, ready in {time.perf_counter() - t0:.1f} s\n")
    encoder = assets.encoder_dir(download=True)
    out.write(f"encoder: {encoder} (sha256 verified)\n")
    return 0


def cmd_export(args, out=None):
    out = out or sys.stdout
    from jaxlab.engine.loading import load
    from jaxlab.io import export

    export.check_export(args.format, qtype=args.qtype, dtype=args.dtype)  # before the model is read
    export.check_output(args.format, args.out, args.overwrite)
    t0 = time.perf_counter()
    m = load(args.model, dtype="float32", progress=sys.stderr.isatty())
    if args.adapter:
        m = _with_adapter(m, args.adapter)
    params = m.params  # the parameters to write (a LoRA adapter merged in)
    what = (args.qtype or "F16") if args.format == "gguf" else (args.dtype or "float32")
    sys.stderr.write(f"exporting {m.source} as {args.format} ({what}) to {args.out}\n")
    source = m.path if m.path is not None and m.path.suffix == ".gguf" else None
    path = export.export(
        args.format, params, m.tokenizer, args.out, qtype=args.qtype, dtype=args.dtype,
        source=source, overwrite=args.overwrite, progress=sys.stderr.isatty(),
    )  # fmt: skip
    size = export.size_on_disk(path)
    out.write(f"wrote {path} ({args.format}, {what}, {size / 1e6:.1f} MB) in {time.perf_counter() - t0:.1f} s\n")
    return 0


def cmd_compile(args, out=None):
    from jaxlab.bench import chip_compile

    return chip_compile.run(args, out or sys.stdout)


def cmd_finetune(args, out=None):
    from jaxlab.train import command

    return command.run(args, out or sys.stdout)


def cmd_check(args, out=None):
    if args.number == "track":  # the build-the-engine track: notebooks 04, 05, 06 and 11 assembled
        from jaxlab.lab.exercises import track

        return track.run(args.notebook, out or sys.stdout)
    from jaxlab.lab import checking

    return checking.run(args, out or sys.stdout)


def cmd_verdicts(args, out=None):
    from jaxlab.lab import verdicts

    return verdicts.run(args, out or sys.stdout)


def cmd_serve(args):
    try:
        import prometheus_client  # noqa: F401
        import starlette  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as e:
        raise JaxlabError(
            f"jaxlab serve needs {e.name}, which is not installed: pip install 'jaxlab[serve]' (make lab installs it)"
        ) from None
    from jaxlab.serve import ServeOptions, engine_for, serve, served_name

    _port_free(args.host, args.port)  # before a minute of loading and compiling, not after
    model = _model_options(args)
    options = ServeOptions(
        model_name=args.served_model_name or served_name(args.model),
        api_key=args.api_key or None,
        rate_limit=args.rate_limit,
        max_body_bytes=args.max_body_bytes,
        request_timeout=args.request_timeout,
        grace_seconds=args.grace,
        slots=args.max_batch,
        max_running=args.max_running,
        kv_tokens=args.kv_tokens,
        kv_memory=args.kv_memory,
        context=args.context,
        speculative=args.draft_k if args.speculative else 0,
        overlap=args.overlap,
        host=args.host,
        port=args.port,
        allowed_hosts=tuple(h for h in args.allowed_hosts.split(",") if h.strip()),
        cors=tuple(o for o in args.cors.split(",") if o.strip()),
        open_metrics=args.open_metrics,
        max_queue=args.max_queue,
        body_timeout=args.body_timeout,
    )
    m = _load(model)
    engine = engine_for(m.params, m.tokenizer, options, model.cache_dtype)
    t0 = time.perf_counter()
    sys.stderr.write(
        "jaxlab serve: compiling the engine's programs (prefill and decode for each page-table width, each serving "
        "greedy and sampling rows and top logprobs when asked; decode row buckets probed first)...\n"
    )
    engine.warmup()  # a request never compiles on the engine's thread
    dropped = [str(b) for b, same in engine.runner.bucket_probe.items() if not same]
    sys.stderr.write(
        f"jaxlab serve: compiled {len(engine.programs)} programs in {time.perf_counter() - t0:.1f} s; up to "
        f"{engine.max_running} requests in {engine.pool.capacity * engine.page_size} KV positions; decode row "
        f"buckets {', '.join(map(str, engine.runner.row_buckets))}"
        + (f" ({', '.join(dropped)} left out: this backend computed a row differently there)" if dropped else "")
        + (
            " (the probe's verdicts stored by an earlier run of these programs on this host)"
            if engine.runner.probe_stored
            else ""
        )
        + (
            f"; up to {engine.speculative} prompt-lookup drafts per greedy request and step"
            if engine.speculative
            else ""
        )
        + "\n"
    )
    return serve(engine, options)


def _port_free(host: str, port: int) -> None:
    """Refuse a port another process holds (a second `jaxlab serve` in a classroom) with what to do, instead of
    uvicorn's bind error after the model has loaded and compiled."""
    import socket

    if port == 0:
        return
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as e:
        raise JaxlabError(f"--host {host}: not an address this machine can serve on ({e.strerror})") from None
    family, kind, proto, _, addr = infos[0]
    with socket.socket(family, kind, proto) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds: a TIME_WAIT port is free
        try:
            sock.bind(addr)
        except OSError as e:
            raise JaxlabError(
                f"port {port} on {host} is in use ({e.strerror}): another server (a second `jaxlab serve`?) holds "
                f"it; stop that one or choose another port, e.g. --port {port + 1}"
            ) from None


def _read_lines(path: str) -> list[str]:
    """The lines of a UTF-8 text file (or stdin for '-'), without their line ends; clear errors otherwise."""
    try:
        raw = sys.stdin.buffer.read() if path == "-" else open(path, "rb").read()
    except FileNotFoundError:
        raise InvalidRequestError(f"--file {path}: no such file") from None
    except IsADirectoryError:
        raise InvalidRequestError(f"--file {path}: is a folder, not a text file") from None
    except OSError as e:
        raise InvalidRequestError(f"--file {path}: cannot read it ({e.strerror})") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line = raw[: e.start].count(b"\n") + 1
        raise InvalidRequestError(
            f"--file {path} is not UTF-8 text (byte {e.start}, line {line}): convert it, e.g. iconv -t UTF-8"
        ) from None
    return text.splitlines()


def cmd_embed(args, out=None):
    import json as _json

    from jaxlab.engine.encoder import load_embedder

    out = out or sys.stdout
    texts = list(args.texts) + (_read_lines(args.file) if args.file else [])
    if not texts:
        raise InvalidRequestError("nothing to embed: give texts as arguments or --file F (an empty text is '')")
    if args.batch_size < 1:
        raise InvalidRequestError(f"--batch-size must be >= 1, got {args.batch_size}")
    emb = load_embedder(batch_size=args.batch_size)
    vectors = emb.embed(texts)
    for text, v in zip(texts, vectors):
        if args.json:
            out.write(_json.dumps({"text": text, "embedding": [float(x) for x in v]}, ensure_ascii=False) + "\n")
        else:
            head = ", ".join(f"{x:+.4f}" for x in v[:4])
            shown = text if len(text) <= 48 else text[:45] + "..."
            out.write(f"{shown!r}: [{head}, ...] ({len(v)} floats, norm {float((v * v).sum()) ** 0.5:.3f})\n")
    return 0


def cmd_ask(args, out=None):
    from jaxlab.retrieval.ask import answer

    out = out or sys.stdout

    def show(piece):
        out.write(piece)
        out.flush()

    reply = answer(
        args.question,
        k=args.k,
        retrieval=not args.no_retrieval,
        max_new_tokens=args.max_new_tokens,
        on_text=show,
        progress=sys.stderr.isatty(),
        log=lambda line: sys.stderr.write(f"jaxlab ask: {line}\n"),
    )
    out.write("\n")
    if reply.sources:
        out.write("\nSources:\n" + "".join(f"  [{i + 1}] {c.path}\n" for i, c in enumerate(reply.sources)))
    return 0


def cmd_bench(args):
    from jaxlab import bench

    return bench.run_from_args(args)


COMMANDS = {
    "generate": cmd_generate,
    "chat": cmd_chat,
    "serve": cmd_serve,
    "embed": cmd_embed,
    "ask": cmd_ask,
    "info": cmd_info,
    "fetch": cmd_fetch,
    "export": cmd_export,
    "finetune": cmd_finetune,
    "compile": cmd_compile,
    "check": cmd_check,
    "verdicts": cmd_verdicts,
    "bench": cmd_bench,
}


def show_warning(message, category, filename, lineno, file=None, line=None, _plain=warnings.showwarning):
    """A :class:`~jaxlab.errors.FallbackWarning` is one line for the user; any other warning as Python shows it."""
    if issubclass(category, FallbackWarning):
        sys.stderr.write(f"jaxlab: note: {message}\n")
    else:
        _plain(message, category, filename, lineno, file, line)


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    warnings.showwarning = show_warning
    try:
        return COMMANDS[args.command](args)
    except JaxlabError as e:
        sys.stderr.write(f"jaxlab: error: {e}\n")
        return EXIT_USER_ERROR
    except KeyboardInterrupt:
        sys.stderr.write("jaxlab: interrupted\n")
        return 130
    except BrokenPipeError:
        return 0
    except Exception as e:  # a bug of ours: still one line, unless debugging
        if os.environ.get("JAXLAB_DEBUG"):
            raise
        sys.stderr.write(f"jaxlab: internal error: {type(e).__name__}: {e} (set JAXLAB_DEBUG=1 for the traceback)\n")
        return EXIT_INTERNAL


if __name__ == "__main__":
    sys.exit(main())
