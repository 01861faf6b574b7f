"""`make peers`: the GGUF files jaxlab exports give, in llama.cpp's llama-server, the greedy tokens jaxlab gives.

For each tensor type (F16 and Q8_0 by default) the model is exported with ``jaxlab.io.export.export_gguf``;
``llama-server`` (built by ``make llama-cpp``) is started on the file alone, so it reads the weights *and* the
tokenizer from it. Each of the six golden chat prompts goes to ``POST /completion`` as token ids (no BOS added:
the file says add_bos_token=false, and token ids are taken as they are) with ``n_predict`` 16, ``temperature`` 0,
``return_tokens`` and ``n_probs`` 2; jaxlab loads the same file (``load_gguf``) and decodes greedily with its
``Generator``. The server is also asked to tokenize the first prompt's text (``POST /tokenize``, special tokens
parsed), which checks the exported tokenizer in llama.cpp.

llama-server's ``ignore_eos`` is not used: it bans every end-of-generation token, which changes the greedy choice
where one is best. So llama-server stops at its end token and its tokens must be the first of jaxlab's (jaxlab
ignores EOS and goes on).

Per prompt the verdict is "same", "near-tie" or "differs" (see :func:`compare`): a near-tie is a step where both
rank the same two candidates first, in swapped order, each by less than NEAR_TIE in log-probability. Both run the
same weights, but llama.cpp's CPU matmuls round the activations to F16 (F16 files) or to 8-bit blocks (Q8_0
files), so a close call may go the other way. One PASS line per file when no prompt differs and the tokenization
agrees, else MISS; the exit status is 1 on a MISS.

With ``--adapter DIR`` (a LoRA adapter from ``jaxlab finetune``) the adapter is merged before the export, two items
of the shipped fine-tuning task's test split join the prompts and 32 tokens are compared (a whole JSON answer): the
tuned behaviour must survive the trip to llama.cpp. ``--json PATH`` writes the results (notebook 15 reads them).

Usage: python scripts/peer_check.py [--model M] [--qtypes F16,Q8_0] [--n 16] [--llama-server PATH] [--keep DIR]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from jaxlab.bench.harness import cpu_name
from jaxlab.bench.serving import ServerProcess, free_port, llama_server_path, request
from jaxlab.engine.generate import Generator
from jaxlab.engine.loading import load
from jaxlab.engine.model import forward, params_from_flat
from jaxlab.io.export import GGUF_QTYPES, export_gguf
from jaxlab.io.gguf import load_gguf
from jaxlab.io.tokenizer import Tokenizer
from jaxlab.tools.reference import GOLDEN_PROMPTS

PROMPTS = GOLDEN_PROMPTS
NEAR_TIE = 0.5  # log-probability gap under which two candidates count as tied (see compare)


def params_to_export(model, args):
    """The float parameters to export: the loaded model's, with ``--adapter DIR`` (a LoRA adapter) merged in, so
    the check runs on the fine-tuned weights."""
    if args.adapter:
        from jaxlab.train import lora

        return lora.merge_folder(model.params, args.adapter)
    return model.params


def llama_greedy(port: int, ids: list[int], n: int) -> tuple[list[int], list[list[tuple[int, float]]]]:
    """llama-server's greedy tokens after ``ids`` (up to ``n``, ending early with an end-of-generation token, which
    is included) and, per step, its top-2 (id, log-probability) before sampling."""
    status, body = request(
        "POST",
        port,
        "/completion",
        {"prompt": ids, "n_predict": n, "temperature": 0, "return_tokens": True, "n_probs": 2,
         "cache_prompt": False, "seed": 0},
    )  # fmt: skip
    if status != 200 or not isinstance(body, dict):
        raise RuntimeError(f"llama-server /completion answered {status}: {str(body)[:300]}")
    top = [
        [(int(t["id"]), float(t["logprob"])) for t in step["top_logprobs"]] for step in body["completion_probabilities"]
    ]
    return [int(t) for t in body["tokens"]], top


def llama_tokenize(port: int, text: str) -> list[int]:
    status, body = request("POST", port, "/tokenize", {"content": text, "add_special": False, "parse_special": True})
    if status != 200 or not isinstance(body, dict):
        raise RuntimeError(f"llama-server /tokenize answered {status}: {str(body)[:300]}")
    return [int(t) for t in body["tokens"]]


def top2(params, ids: list[int]) -> list[tuple[int, float]]:
    """jaxlab's best two next tokens after ``ids``: [(id, log-probability)] * 2."""
    logits, _ = forward(params, np.asarray([ids], np.int32), np.arange(len(ids), dtype=np.int32)[None])
    row = np.asarray(logits[0, -1], np.float64)
    logp = row - row.max() - np.log(np.exp(row - row.max()).sum())
    best = np.argsort(-row)[:2]
    return [(int(i), float(logp[i])) for i in best]


def compare(params, prompt, ours, theirs, their_top, eog) -> tuple[str, str]:
    """("same" | "near-tie" | "differs", a description). llama-server's tokens must be jaxlab's first tokens, ending
    at the same length or at an end-of-generation token (where llama-server stops and jaxlab, told to ignore EOS,
    goes on). A near-tie: where they part, both rank the same two tokens first, in swapped order, each with a gap
    under NEAR_TIE in log-probability."""
    k = next((j for j, (a, b) in enumerate(zip(ours, theirs)) if a != b), None)
    if k is None:
        if len(theirs) == len(ours) or (theirs and theirs[-1] in eog):
            return "same", f"{len(theirs)} tokens"
        return "differs", f"llama-server stopped after {len(theirs)} tokens without an end token"
    mine = top2(params, prompt + ours[:k])
    gap_ours, gap_theirs = mine[0][1] - mine[1][1], their_top[k][0][1] - their_top[k][1][1]
    swapped = [t for t, _ in mine] == [t for t, _ in their_top[k]][::-1]
    how = "near-tie" if swapped and max(gap_ours, gap_theirs) < NEAR_TIE else "differs"
    return how, (
        f"part at token {k}: jaxlab {ours[k]} (top-2 gap {gap_ours:.3f}), llama-server {theirs[k]} (gap "
        f"{gap_theirs:.3f}), {'the same two candidates swapped' if swapped else 'different candidates'}"
    )


def check_file(path: Path, qtype: str, server: Path, n: int, log, texts=PROMPTS) -> dict:
    tok = Tokenizer.from_gguf(path)
    cfg, flat = load_gguf(path)
    params = params_from_flat(cfg, flat)
    prompts = [tok.apply_chat_template([{"role": "user", "content": p}], tokenize=True) for p in texts]
    ours = [r.generated_ids for r in Generator(params, tok).generate(prompts, max_new_tokens=n, ignore_eos=True)]
    port = free_port()
    argv = [str(server), "-m", str(path), "-t", "2", "-c", "1024", "--host", "127.0.0.1", "--port", str(port)]
    with ServerProcess(f"llama-server {qtype}", argv + ["--no-webui"], port, log):
        answers = [llama_greedy(port, ids, n) for ids in prompts]
        text = tok.apply_chat_template([{"role": "user", "content": texts[0]}])
        tokenized = llama_tokenize(port, text) == prompts[0]
    verdicts = [compare(params, p, a, b, top, tok.special_ids) for p, a, (b, top) in zip(prompts, ours, answers)]
    kinds = [v for v, _ in verdicts]
    ok = "differs" not in kinds and tokenized
    summary = (
        f"{path.name} ({path.stat().st_size / 1e6:.1f} MB): of {len(kinds)} "
        f"prompts, {kinds.count('same')} give the same greedy tokens (up to {n}) in llama-server and jaxlab, "
        f"{kinds.count('near-tie')} part at a near-tie, {kinds.count('differs')} differ; llama-server tokenizes the "
        f"chat prompt {'as jaxlab does' if tokenized else 'DIFFERENTLY'}"
    )
    print(f"{'PASS' if ok else 'MISS'}  {qtype:5s} {summary}", flush=True)
    details = [
        f"prompt {i} ({texts[i][:60]!r}): {kind}: {what}" for i, (kind, what) in enumerate(verdicts) if kind != "same"
    ]
    for line in details:
        print(f"      {line}", flush=True)
    return {"qtype": qtype, "status": "PASS" if ok else "MISS", "summary": summary, "details": details,
            "verdicts": kinds, "tokenized_alike": tokenized}  # fmt: skip


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=None, help="what to export (default: the embedded model)")
    p.add_argument("--qtypes", default="F16,Q8_0", help=f"comma-separated, of {', '.join(GGUF_QTYPES)}")
    p.add_argument("--n", type=int, default=16, help="new tokens per prompt (with --adapter: at least 32)")
    p.add_argument("--llama-server", default=None, help="default: the one `make llama-cpp` built")
    p.add_argument("--keep", default=None, metavar="DIR", help="write the GGUF files here (default: a temp folder)")
    p.add_argument("--adapter", default=None, metavar="DIR", help="a LoRA adapter (jaxlab finetune) merged in first")
    p.add_argument("--json", default=None, metavar="PATH", help="also write the results here (notebook 15 reads them)")
    args = p.parse_args(argv)
    server = Path(args.llama_server) if args.llama_server else llama_server_path()
    if not server.is_file():
        print(f"llama-server not found at {server}: run `make llama-cpp` first", file=sys.stderr)
        return 2
    log = lambda msg: print(f"  [{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)  # noqa: E731
    print(f"peer check of the GGUF export: jaxlab vs llama-server ({server.parent.parent.name}), "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {cpu_name()}", flush=True)  # fmt: skip
    model = load(args.model, dtype="float32")
    params = params_to_export(model, args)
    texts = list(PROMPTS)
    if args.adapter:  # two test items of the shipped fine-tuning task: the tuned behaviour must survive the export
        from jaxlab.io.assets import data_file
        from jaxlab.train.data import read_jsonl

        texts += [e["prompt"] for e in read_jsonl(data_file("finetune", "test.jsonl"))[:2]]
        args.n = max(args.n, 32)  # a whole JSON answer
    rows = []
    with tempfile.TemporaryDirectory(prefix="jaxlab-peers-") as tmp:
        folder = Path(args.keep or tmp)
        for qtype in args.qtypes.split(","):
            path = folder / f"{model.source}-{qtype}.gguf".replace("/", "_")
            log(f"exporting {qtype} to {path}")
            export_gguf(params, model.tokenizer, path, qtype=qtype, source=model.path, overwrite=True)
            rows.append(check_file(path, qtype, server, args.n, log, texts))
    if args.json:
        record = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "cpu": cpu_name(),
                  "llama_cpp": server.parent.parent.name, "adapter": args.adapter, "files": rows}  # fmt: skip
        Path(args.json).write_text(json.dumps(record, indent=1) + "\n")
    return 0 if all(r["status"] == "PASS" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
