"""``jaxlab finetune``: its options and its run (the face of :mod:`jaxlab.train` on the command line).

Trains a LoRA adapter (:func:`jaxlab.train.finetune.finetune`) on a JSONL file of ``{"prompt", "answer"}`` pairs, or
on the shipped JSON-extraction task when ``--data`` is not given; ``--test FILE`` then scores the base model's and
the tuned model's greedy answers on that file and records both in ``OUT/history.json``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--data",
        default=None,
        metavar="FILE.jsonl",
        help='one {"prompt": ..., "answer": ...} per line (default: the shipped JSON-extraction task)',
    )
    parser.add_argument(
        "--validation", default=None, metavar="FILE.jsonl", help="validation loss every --eval-every steps"
    )
    parser.add_argument(
        "--test",
        default=None,
        metavar="FILE.jsonl",
        help="after training, score greedy answers of the base and the tuned model on this file",
    )
    parser.add_argument(
        "--out", required=True, metavar="DIR", help="the adapter, history and checkpoint (resumes from it)"
    )
    parser.add_argument("--steps", type=int, default=80, metavar="N")
    parser.add_argument("--batch-size", type=int, default=8, metavar="B")
    parser.add_argument("--rank", type=int, default=8, metavar="R")
    parser.add_argument("--alpha", type=float, default=16.0)
    parser.add_argument("--targets", default="wq,wk,wv,wo,w_gate,w_up,w_down", help="kernels that get adapters")
    parser.add_argument("--lr", type=float, default=2e-3, help="peak learning rate (default 2e-3)")
    parser.add_argument("--warmup", type=int, default=8, metavar="N", help="steps of linear warm-up (default 8)")
    parser.add_argument("--weight-decay", type=float, default=0.0)
    parser.add_argument("--clip", type=float, default=1.0, help="global gradient-norm clip (default 1.0)")
    parser.add_argument("--remat", action="store_true", help="recompute each layer in the backward pass (less memory)")
    parser.add_argument("--eval-every", type=int, default=40, metavar="N")
    parser.add_argument("--save-every", type=int, default=20, metavar="N")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--model", default=None, help="embedded name (default), a .gguf file or a HF checkpoint folder")


def run(args, out) -> int:
    from jaxlab.io.assets import data_file
    from jaxlab.train import data, finetune, lora, step

    lora_config = lora.LoraConfig(rank=args.rank, alpha=args.alpha, targets=tuple(args.targets.split(",")))
    train_config = step.TrainConfig(
        steps=args.steps, lr=args.lr, warmup=args.warmup, weight_decay=args.weight_decay, clip=args.clip,
        batch_size=args.batch_size, remat=args.remat, seed=args.seed,
    )  # fmt: skip
    shipped = args.data is None
    examples = data.read_jsonl(data_file("finetune", "train.jsonl") if shipped else args.data)
    val_file = args.validation or (data_file("finetune", "validation.jsonl") if shipped else None)
    validation = data.read_jsonl(val_file) if val_file else []
    test = data.read_jsonl(args.test) if args.test else []
    from jaxlab.engine.loading import load
    from jaxlab.tools import compile_cache

    compile_cache.enable()
    m = load(args.model, dtype="float32", progress=sys.stderr.isatty())
    adapter, history = finetune.finetune(
        m.params, m.tokenizer, examples, args.out, lora_config=lora_config, train_config=train_config,
        validation=validation, eval_every=args.eval_every, save_every=args.save_every,
        progress=sys.stderr.isatty(),
    )  # fmt: skip
    out.write(
        f"{args.steps} steps, final loss {history.loss[-1]:.4f}"
        + (f", validation loss {history.val_loss[-1]:.4f}" if history.val_loss else "")
        + f"; {history.tokens_per_second:.0f} tokens/s over {history.seconds:.0f} s of steps"
        + f" (+{history.compile_seconds:.0f} s compiling); adapter in {args.out}\n"
    )
    if test:
        before = finetune.evaluate(m.params, m.tokenizer, test, progress=sys.stderr.isatty())
        after = finetune.evaluate(
            m.params, m.tokenizer, test, adapter=adapter, lora_config=lora_config, progress=sys.stderr.isatty()
        )
        for name, r in (("base", before), ("fine-tuned", after)):
            out.write(f"{name:>10}: JSON match {r['match']:.1%}, exact string {r['exact']:.1%} of {r['n']}\n")
        record = Path(args.out) / "history.json"
        hist = json.loads(record.read_text())
        hist["test"] = {"file": str(args.test), "base": before, "tuned": after}
        record.write_text(json.dumps(hist, indent=1))
    return 0
