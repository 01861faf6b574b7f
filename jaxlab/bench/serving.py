"""``jaxlab bench --serve``: ``jaxlab serve`` under load, beside llama.cpp's ``llama-server`` on the same machine,
the same GGUF, the same prompts — measured side by side in one run.

* **Servers.** Each runs in its own process, started here and stopped when its levels are done: ours is
  ``jaxlab serve --max-batch S --context P+N --quant Q --kv-cache KV``; the peer is ``llama-server -m <the
  embedded GGUF> -t 2 -np S -c S*(P+N)`` (built by ``make llama-cpp``: ``scripts/build_llama_cpp.sh``). One
  server runs at a time, so neither steals the other's cores.
* **Load.** At each concurrency C, C clients (threads of this process, plain ``http.client``) each send
  ``requests_per_client`` streaming ``POST /v1/completions`` one after another: a prompt of P token ids (a
  window of a fixed English text; every request of the run has its own window, so no server can reuse a
  prefix), ``max_tokens`` N, ``temperature`` 0, ``ignore_eos`` true — the same bodies to both servers.
* **Measured**, per level: requests/s and output tokens/s (output tokens / wall time from the first request
  sent to the last token received), TTFT (request sent to its first streamed token) and TPOT ((last token -
  first token) / (tokens - 1)) percentiles, and the requests that failed or came back short.

The two sides do not compute the same thing: llama.cpp runs its own Q4_1 kernels on the GGUF's 4-bit weights
(f16 KV cache), jaxlab the weights re-quantized to int8 (per output channel) through XLA:CPU, with an int8 KV
cache by default — the fastest format that passes the quality threshold (``benchmarks/README.md``).
"""

from __future__ import annotations

import http.client
import json
import math
import operator
import os
import platform
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from jaxlab.bench.stats import ratio
from jaxlab.errors import InvalidRequestError, JaxlabError

#: Sizes of a full run and of ``--quick`` (a smoke test of the same code).
SERVE = {"concurrency": (1, 8, 32, 64), "prompt_len": 128, "new_tokens": 64, "requests_per_client": 2, "slots": 32}
QUICK_SERVE = {"concurrency": (1, 4), "prompt_len": 16, "new_tokens": 8, "requests_per_client": 1, "slots": 4}
#: The format our server runs by default: the fastest at batch 32 that passes the quality report.
SERVE_QUANT, SERVE_KV = "int8", "int8"
LLAMA_CPP_VERSION = "0.3.36"
#: The target's level: output tokens/s and p99 TTFT at this many concurrent clients.
TARGET_CONCURRENCY = 32


@dataclass(frozen=True)
class ServeBench:
    concurrency: tuple[int, ...]
    prompt_len: int
    new_tokens: int
    requests_per_client: int
    slots: int
    quant: str
    kv_cache: str
    llama_server: str | None  # path of llama-server, or None: no peer
    quick: bool = False
    overlap: bool = True  # False: jaxlab serve --no-overlap


def llama_server_path() -> Path:
    """Where ``make llama-cpp`` puts llama-server: ``$JAXLAB_CACHE/llama-cpp/<version>/bin/llama-server``."""
    from jaxlab.io.assets import cache_dir

    return cache_dir() / "llama-cpp" / LLAMA_CPP_VERSION / "bin" / "llama-server"


def resolve(args) -> ServeBench:
    """The run's settings from ``jaxlab bench --serve``'s arguments, checked."""
    quick = bool(getattr(args, "quick", False))
    d = QUICK_SERVE if quick else SERVE
    peer = getattr(args, "llama_server", None)
    if peer is None:
        found = llama_server_path()
        if not found.exists():
            raise InvalidRequestError(
                f"the peer llama-server is not built ({found} is missing): run `make llama-cpp` (about 10 minutes "
                "on 2 cores), pass --llama-server PATH, or --llama-server none to measure jaxlab alone"
            )
        peer = str(found)
    elif peer == "none":
        peer = None
    elif not (Path(peer).is_file() and os.access(peer, os.X_OK)):
        raise InvalidRequestError(f"--llama-server {peer}: not an executable file (build it with `make llama-cpp`)")
    opts = ServeBench(
        concurrency=tuple(sorted(set(getattr(args, "concurrency", None) or d["concurrency"]))),
        prompt_len=getattr(args, "prompt_len", None) or d["prompt_len"],
        new_tokens=getattr(args, "new_tokens", None) or d["new_tokens"],
        requests_per_client=getattr(args, "requests_per_client", None) or d["requests_per_client"],
        slots=getattr(args, "serve_slots", None) or d["slots"],
        quant=getattr(args, "serve_quant", None) or SERVE_QUANT,
        kv_cache=getattr(args, "serve_kv", None) or SERVE_KV,
        llama_server=peer,
        quick=quick,
        overlap=not getattr(args, "serve_no_overlap", False),
    )
    from jaxlab.engine.loading import ModelOptions

    ModelOptions(quant=None if opts.quant == "none" else opts.quant, kv_cache=opts.kv_cache)  # jaxlab serve's rules
    for name in ("prompt_len", "new_tokens", "requests_per_client", "slots"):
        if getattr(opts, name) < 1:
            raise InvalidRequestError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(opts, name)}")
    if opts.new_tokens < 2:
        raise InvalidRequestError("--new-tokens must be >= 2 (time per output token needs two tokens)")
    return opts


# ---- the servers ---------------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerProcess:
    """A server in its own process (its own session, so a stop reaches its children), ready when ``GET /health``
    answers 200; its output goes to a log file that an error quotes."""

    def __init__(self, name: str, argv: list[str], port: int, log, env: dict | None = None):
        self.name, self.argv, self.port, self.log = name, argv, port, log
        self.logfile = (
            Path(os.environ.get("TMPDIR", "/tmp")) / f"jaxlab-bench-serve-{name.replace(' ', '-')}-{port}.log"
        )
        self.env = env
        self.proc: subprocess.Popen | None = None

    def __enter__(self):
        self.log(f"starting {self.name}: {' '.join(self.argv)}")
        t0 = time.perf_counter()
        with open(self.logfile, "wb") as f:
            self.proc = subprocess.Popen(
                self.argv, stdout=f, stderr=subprocess.STDOUT, env=self.env, start_new_session=True
            )
        while True:
            if self.proc.poll() is not None:
                raise JaxlabError(f"{self.name} exited with {self.proc.returncode} while starting: {self.tail()}")
            if time.perf_counter() - t0 > 600:
                self.stop()
                raise JaxlabError(f"{self.name} was not ready after 600 s: {self.tail()}")
            try:
                status, _ = request("GET", self.port, "/health", timeout=2)
                if status == 200:
                    break
            except OSError:
                pass
            time.sleep(0.25)
        self.ready_s = time.perf_counter() - t0
        self.log(f"{self.name} ready in {self.ready_s:.1f} s (log: {self.logfile})")
        return self

    def tail(self, n: int = 600) -> str:
        try:
            return self.logfile.read_text(errors="replace")[-n:].strip() or "(no output)"
        except OSError:
            return "(no log)"

    def stop(self):
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGINT)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()

    def __exit__(self, *exc):
        self.stop()


def jaxlab_argv(opts: ServeBench, port: int) -> list[str]:
    exe = shutil.which("jaxlab", path=str(Path(sys.executable).parent)) or shutil.which("jaxlab")
    head = [exe] if exe else [sys.executable, "-c", "import sys; from jaxlab.cli import main; sys.exit(main())"]
    return head + [
        "serve",
        "--port", str(port),
        "--max-batch", str(opts.slots),
        "--context", str(opts.prompt_len + opts.new_tokens),
        "--kv-cache", opts.kv_cache,
        "--request-timeout", "3600",
    ] + ([] if opts.quant == "none" else ["--quant", opts.quant]) + ([] if opts.overlap else ["--no-overlap"])  # fmt: skip


def llama_argv(opts: ServeBench, port: int, gguf: Path) -> list[str]:
    return [
        str(opts.llama_server),
        "-m", str(gguf),
        "-t", "2",
        "-np", str(opts.slots),
        "-c", str(opts.slots * (opts.prompt_len + opts.new_tokens)),
        "--host", "127.0.0.1",
        "--port", str(port),
        "--no-webui",
    ]  # fmt: skip


# ---- the load ---------------------------------------------------------------------------------------------


def request(method: str, port: int, path: str, body: dict | None = None, timeout: float = 3600):
    """One plain HTTP request on loopback -> (status, parsed JSON or text)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        data = json.dumps(body).encode() if body is not None else None
        conn.request(method, path, body=data, headers={"Content-Type": "application/json"} if data else {})
        r = conn.getresponse()
        raw = r.read().decode(errors="replace")
        try:
            return r.status, json.loads(raw)
        except ValueError:
            return r.status, raw
    finally:
        conn.close()


def stream_completion(port: int, body: dict) -> dict:
    """One streaming ``/v1/completions`` request: its send time, the time of each streamed piece of text, the
    text, the finish reason and the usage the server reported (if any), or the error."""
    out = {"t_send": time.perf_counter(), "t_tokens": [], "text": "", "finish_reason": None, "usage": None}
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=3600)
    try:
        conn.request("POST", "/v1/completions", body=json.dumps(body), headers={"Content-Type": "application/json"})
        r = conn.getresponse()
        if r.status != 200:
            out["error"] = f"HTTP {r.status}: {r.read()[:300].decode(errors='replace')}"
            return out
        for raw in r:
            line = raw.decode(errors="replace").strip()
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                break
            chunk = json.loads(data)
            if chunk.get("usage"):
                out["usage"] = chunk["usage"]
            for choice in chunk.get("choices") or []:
                if choice.get("text"):
                    out["t_tokens"].append(time.perf_counter())
                    out["text"] += choice["text"]
                if choice.get("finish_reason"):
                    out["finish_reason"] = choice["finish_reason"]
    except (OSError, ValueError, http.client.HTTPException) as e:
        out["error"] = f"{type(e).__name__}: {e}"
    finally:
        conn.close()
    return out


def run_level(port: int, model: str, prompts: list[list[int]], concurrency: int, opts: ServeBench) -> dict:
    """``concurrency`` clients, each sending its share of ``prompts`` one after another; the level's figures."""
    per = opts.requests_per_client
    results: list[dict | None] = [None] * (concurrency * per)

    def client(c: int):
        for r in range(per):
            i = c * per + r
            body = {
                "model": model,
                "prompt": prompts[i],
                "max_tokens": opts.new_tokens,
                "temperature": 0,
                "ignore_eos": True,
                "stream": True,
                "stream_options": {"include_usage": True},
            }
            results[i] = stream_completion(port, body)

    threads = [threading.Thread(target=client, args=(c,), daemon=True) for c in range(concurrency)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return level_figures([r for r in results if r is not None], t0, concurrency, opts.new_tokens)


def percentile(values: list[float], q: float) -> float | None:
    """The q-th percentile (nearest rank), or None for no values."""
    if not values:
        return None
    v = sorted(values)
    k = max(0, min(len(v) - 1, math.ceil(q / 100 * len(v)) - 1))
    return v[k]


def level_figures(results: list[dict], t0: float, concurrency: int, new_tokens: int) -> dict:
    """Requests/s, output tokens/s, TTFT and TPOT percentiles of one level's requests (sent from ``t0``)."""
    ok = [r for r in results if "error" not in r and r["t_tokens"]]
    tokens = [(r["usage"] or {}).get("completion_tokens") or len(r["t_tokens"]) for r in ok]
    end = max((r["t_tokens"][-1] for r in ok), default=t0)
    wall = end - t0
    ttft = [r["t_tokens"][0] - r["t_send"] for r in ok]
    tpot = [(r["t_tokens"][-1] - r["t_tokens"][0]) / (n - 1) for r, n in zip(ok, tokens) if n > 1]
    return {
        "concurrency": concurrency,
        "requests": len(results),
        "failed": len(results) - len(ok),
        "errors": sorted({r["error"] for r in results if "error" in r})[:3],
        "short": sum(1 for n in tokens if n < new_tokens),
        # prompt tokens the server said it took from its cache (llama-server reports them; every prompt here is
        # a window of its own, so this should stay near 0 on both sides)
        "cached_prompt_tokens": sum(
            (((r["usage"] or {}).get("prompt_tokens_details") or {}).get("cached_tokens") or 0) for r in ok
        ),
        "output_tokens": sum(tokens),
        "wall_s": wall,
        "requests_per_s": len(ok) / wall if wall > 0 else None,
        "output_tokens_per_s": sum(tokens) / wall if wall > 0 else None,
        "ttft_s": {q: percentile(ttft, q) for q in (50, 90, 99)},
        "tpot_s": {q: percentile(tpot, q) for q in (50, 90, 99)},
        "first_text": ok[0]["text"][:80] if ok else None,
    }


def measure_server(name: str, argv: list[str], port: int, model: str, prompts, opts: ServeBench, log) -> dict:
    """Start one server, warm it with one request, run every level, stop it."""
    env = dict(os.environ)
    with ServerProcess(name, argv, port, log, env=env) as server:
        warm = stream_completion(
            port,
            {
                "model": model,
                "prompt": prompts[0],
                "max_tokens": 2,
                "temperature": 0,
                "ignore_eos": True,
                "stream": True,
            },
        )
        if "error" in warm:
            raise JaxlabError(f"{name} refused the warm-up request: {warm['error']}")
        levels, start = [], 1  # prompts[0] warmed up; every measured request has its own window
        for c in opts.concurrency:
            n = c * opts.requests_per_client
            log(f"{name}: {c} concurrent clients, {n} requests of {opts.prompt_len} + {opts.new_tokens} tokens")
            lv = run_level(port, model, prompts[start : start + n], c, opts)
            start += n
            log(
                f"{name}: {c} clients: {lv['output_tokens_per_s'] or 0:.1f} output tok/s, p50 TTFT "
                f"{(lv['ttft_s'][50] or 0):.2f} s, {lv['failed']} failed"
            )
            levels.append(lv)
        return {"name": name, "argv": argv, "ready_s": server.ready_s, "levels": levels}


def measure_serving(opts: ServeBench, log) -> dict:
    """Both servers, every level: the results dict (what ``--json`` writes)."""
    from jaxlab.bench.prompts import TEXT, make_prompts
    from jaxlab.io import assets
    from jaxlab.io.tokenizer import Tokenizer

    gguf = assets.model_path()
    tok = Tokenizer.from_gguf(gguf)
    total = 1 + sum(c * opts.requests_per_client for c in opts.concurrency)
    prompts = make_prompts(tok.encode(TEXT), total, opts.prompt_len)
    model = assets.DEFAULT_MODEL
    res = {"servers": []}
    port = free_port()
    res["servers"].append(
        measure_server("jaxlab serve", jaxlab_argv(opts, port) + ["--served-model-name", model], port, model,
                       prompts, opts, log)
    )  # fmt: skip
    if opts.llama_server:
        port = free_port()
        res["servers"].append(
            measure_server("llama-server", llama_argv(opts, port, gguf) + ["--alias", model], port, model,
                           prompts, opts, log)
        )  # fmt: skip
    return res


def _percentile(level: dict, kind: str, q: int):
    """``level[kind][q]``: a percentile of a level (keyed by a string once read back from JSON)."""
    return level[kind].get(q, level[kind].get(str(q)))


#: The serving targets (the engine issue's): (clients, what, the figure read from a level, whether the target is on
#: ours / llama-server's figure or on ours alone, comparison, limit).
SERVE_TARGETS = (
    (1, "output tok/s >= 0.8x llama-server's", lambda lv: lv["output_tokens_per_s"], True, operator.ge, 0.8),
    (1, "p50 TPOT <= 1.5x llama-server's", lambda lv: _percentile(lv, "tpot_s", 50), True, operator.le, 1.5),
    (TARGET_CONCURRENCY, "output tok/s >= 1.4x llama-server's", lambda lv: lv["output_tokens_per_s"], True,
     operator.ge, 1.4),
    (TARGET_CONCURRENCY, "p99 TTFT no worse than llama-server's (ratio <= 1.0)",
     lambda lv: _percentile(lv, "ttft_s", 99), True, operator.le, 1.0),
    (64, "no failed or short request", lambda lv: lv["failed"] + lv.get("short", 0), False, operator.le, 0),
)  # fmt: skip


def serve_targets(res: dict) -> list[dict]:
    """Each of :data:`SERVE_TARGETS` read from the levels measured: PASS or MISS, or n/a where the level was not run
    (or, for a ratio, llama-server was not). Ratios are ours / llama-server's at the same client count, one run."""
    levels = [{lv["concurrency"]: lv for lv in s["levels"]} for s in res["servers"]]
    ours, peer = levels[0], levels[1] if len(levels) > 1 else {}
    out = []
    for clients, what, read, vs_peer, passes, limit in SERVE_TARGETS:
        mine, theirs = ours.get(clients), peer.get(clients)
        if not vs_peer:
            measured = None if mine is None else read(mine)
        else:
            measured = ratio(mine and read(mine), theirs and read(theirs))
        out.append(
            {
                "target": f"{clients} client{'s' * (clients > 1)}: {what}",
                "measured": measured,
                "status": "n/a" if measured is None else ("PASS" if passes(measured, limit) else "MISS"),
            }
        )
    return out


def render_serving(res: dict) -> str:
    """The side-by-side table: one line per server and level, then ours ÷ peer per level."""
    o = res["options"]
    lines = [
        f"{o['prompt_len']} prompt + {o['new_tokens']} output tokens (EOS ignored, temperature 0), "
        f"{o['requests_per_client']} request(s) per client, {o['slots']} slots on both servers",
        "",
        f"{'server':14s} {'clients':>7s} {'req/s':>7s} {'out tok/s':>9s} {'TTFT p50':>9s} {'p99':>7s} "
        f"{'TPOT p50':>9s} {'p99':>7s} {'failed':>6s}",
    ]

    def ms(x):
        return "-" if x is None else f"{x * 1000:.0f} ms" if x < 1 else f"{x:.2f} s"

    for s in res["servers"]:
        for lv in s["levels"]:
            lines.append(
                f"{s['name']:14s} {lv['concurrency']:7d} {lv['requests_per_s'] or 0:7.2f} "
                f"{lv['output_tokens_per_s'] or 0:9.1f} {ms(lv['ttft_s'][50]):>9s} {ms(lv['ttft_s'][99]):>7s} "
                f"{ms(lv['tpot_s'][50]):>9s} {ms(lv['tpot_s'][99]):>7s} {lv['failed'] + lv['short']:6d}"
            )
    if len(res["servers"]) > 1:
        lines += ["", "jaxlab / llama-server (output tok/s: > 1 is faster; p99 TTFT: < 1 is faster)"]
        peer = {lv["concurrency"]: lv for lv in res["servers"][1]["levels"]}
        for lv in res["servers"][0]["levels"]:
            p = peer.get(lv["concurrency"])
            t = ratio(lv["output_tokens_per_s"], p and p["output_tokens_per_s"])
            f = ratio(lv["ttft_s"][99], p and p["ttft_s"][99])
            lines.append(
                f"  {lv['concurrency']:3d} clients: output tok/s {'-' if t is None else f'{t:.2f}x'}, "
                f"p99 TTFT {'-' if f is None else f'{f:.2f}x'}"
            )
    lines += ["", "What each side computes:"] + [f"  {w}" for w in res["what"]]
    return "\n".join(lines) + "\n"


def run_serve(args, out) -> int:
    """``jaxlab bench --serve``: measure both servers, print the table (targets with ``--targets``), write
    ``--json``."""
    from jaxlab.bench.harness import Progress
    from jaxlab.bench.output import finish, host_meta

    opts = resolve(args)
    log = Progress()
    res = {
        "options": {k: (list(v) if isinstance(v, tuple) else v) for k, v in opts.__dict__.items()},
        "meta": host_meta(
            python=platform.python_version(),
            llama_cpp=f"llama.cpp vendored in llama-cpp-python=={LLAMA_CPP_VERSION}" if opts.llama_server else None,
        ),
        "what": [
            f"jaxlab serve: continuous batching over a paged KV cache, {opts.quant} weights (re-quantized from the "
            f"GGUF's dequantized Q4_1), {opts.kv_cache} KV cache, XLA:CPU, "
            + ("each decode call launched a step early (look-ahead)" if opts.overlap else "--no-overlap")
            + "; the load generator shares the machine",
            "llama-server: llama.cpp's own Q4_1 kernels on the GGUF's 4-bit weights, f16 KV cache, -t 2 threads, "
            "continuous batching over -np slots"
            if opts.llama_server
            else "llama-server: not run (--llama-server none)",
        ],
    }
    res.update(measure_serving(opts, log))
    res["meta"]["load_average_end"] = os.getloadavg()
    res["meta"]["elapsed_s"] = log.elapsed()
    res["targets"] = serve_targets(res)
    text = f"jaxlab bench --serve  |  {res['meta']['cpu']}  |  {os.cpu_count()} CPUs\n\n" + render_serving(res)
    return finish(res, text, args, out)
