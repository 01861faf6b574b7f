"""The reference implementation (Hugging Face ``transformers`` on PyTorch) and the golden files made from it.

jaxlab's logits, greedy tokens and token ids must equal the reference's on the same GGUF file. Tests
compare against ``transformers`` directly; notebooks compare against ``data/reference/*.json``, golden
outputs written by ``scripts/make_reference.py`` (which calls :func:`make_golden`), so a notebook runs
without torch. A test regenerates the golden data and fails when the stored file is stale.

What "matches the golden file" means depends on the backend (:func:`golden_criteria`): on a CPU the
model runs in float32 at the highest matmul precision and must reproduce the reference exactly (ids
identical, logits within 1e-4); on TPU and GPU it runs in bfloat16 by default
(:func:`jaxlab.engine.model.backend_default_dtype`), where near-ties may go the other way, so
:func:`check_golden` asks for teacher-forced top-1 agreement >= 99 % and the first 16 greedy tokens
identical on >= 5 of the 6 golden prompts, and prints the numbers. :func:`compare_greedy` applies the
per-prompt rule to one greedy continuation (a notebook's single-prompt checks).

torch and transformers are imported only inside the functions that need them.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Sequence

import numpy as np

from jaxlab.io.assets import data_dir, data_file

GOLDEN_DIR = data_dir() / "reference"
GOLDEN_FILE = GOLDEN_DIR / "smollm2_135m.json"
GOLDEN_PROMPTS = (
    "What is the capital of France?",
    "Write a Python function that reverses a string.",
    "Explain in one sentence what a KV cache is.",
    "List three primary colors.",
    "Translate 'good morning' into Spanish.",
    "What is 17 times 23?",
)
GREEDY_TOKENS = 32
TOP = 10
LOGIT_DECIMALS = 3


def load_reference(gguf_path, dtype: str = "float32"):
    """(model, tokenizer) of ``transformers`` loaded from the same GGUF file, in float32 on the CPU."""
    from transformers import AutoTokenizer

    folder, name = os.path.split(os.path.abspath(gguf_path))
    with gguf_read_once():  # the tokenizer's parse of the file serves the model too
        tok = AutoTokenizer.from_pretrained(folder, gguf_file=name)
        model = hf_model(gguf_path, dtype)
    return model, tok


def hf_model(model, dtype: str = "float32"):
    """``transformers``' causal LM in eval mode, its warnings and progress bars off, from a GGUF file (each file
    parsed once: :func:`gguf_read_once`), a Hugging Face folder or a hub id."""
    import torch
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    if str(model).endswith(".gguf"):
        folder, name = os.path.split(os.path.abspath(model))
        with gguf_read_once():
            loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=getattr(torch, dtype))
    else:
        loaded = AutoModelForCausalLM.from_pretrained(str(model), dtype=getattr(torch, dtype))
    return loaded.eval()


@contextlib.contextmanager
def gguf_read_once():
    """Within this block, ``transformers`` parses each GGUF file once. Loading one GGUF model it parses the file
    three times (the tokenizer's config, the model's config, the weights: a new ``gguf.GGUFReader`` each, seconds
    apiece for a 49,152-token vocabulary) and rebuilds gguf's tensor-name map for every module; here the readers
    are kept per file and the map per (architecture, layers). Nothing else changes: the same reader class reads
    the same bytes."""
    import gguf

    real_reader, real_map = gguf.GGUFReader, gguf.get_tensor_name_map
    readers: dict = {}

    def reader(path, *args, **kwargs):
        key = (os.path.abspath(path), args, tuple(sorted(kwargs.items())))
        if key not in readers:
            readers[key] = real_reader(path, *args, **kwargs)
        return readers[key]

    gguf.GGUFReader, gguf.get_tensor_name_map = reader, functools.cache(real_map)
    try:
        yield
    finally:
        gguf.GGUFReader, gguf.get_tensor_name_map = real_reader, real_map


def reference_logits(model, ids: list[int]) -> np.ndarray:
    """Logits [T, V] of the reference for one sequence of token ids."""
    import torch

    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].float().numpy()


def reference_greedy(model, ids: list[int], n: int = GREEDY_TOKENS) -> list[int]:
    """``transformers.generate`` greedy continuation of ``n`` tokens, EOS ignored."""
    import torch

    # generate() fills unset fields of the generation config it is given from the model's own
    # defaults, so an eos_token_id of None in a passed config comes back as EOS; switch it off on the
    # model's config itself for the duration of the call.
    gc = model.generation_config
    saved = (gc.eos_token_id, gc.do_sample, gc.temperature, gc.top_p, gc.top_k)
    try:
        gc.eos_token_id, gc.do_sample, gc.temperature, gc.top_p, gc.top_k = None, False, None, None, None
        with torch.no_grad():
            out = model.generate(
                torch.tensor([ids]),
                attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                max_new_tokens=n,
                min_new_tokens=None,
                pad_token_id=2,
            )
    finally:
        gc.eos_token_id, gc.do_sample, gc.temperature, gc.top_p, gc.top_k = saved
    tokens = out[0, len(ids) :].tolist()
    if len(tokens) != n:
        raise RuntimeError(f"the reference generated {len(tokens)} tokens, expected {n} with EOS ignored")
    return tokens


def chat_ids(tokenizer, prompt: str) -> list[int]:
    """Token ids of one user message through the chat template (reference tokenizer)."""
    out = tokenizer.apply_chat_template(
        [{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=True
    )
    if hasattr(out, "keys"):
        out = out["input_ids"]
    return list(map(int, out))


def logit_summary(logits_row: np.ndarray, top: int = TOP) -> dict:
    """A CPU-independent summary of one position's logits: the top ids and their rounded values."""
    order = np.argsort(-logits_row, kind="stable")[:top]
    return {
        "top_ids": [int(i) for i in order],
        "top_logits": [round(float(logits_row[i]), LOGIT_DECIMALS) for i in order],
        "max_abs": round(float(np.abs(logits_row).max()), LOGIT_DECIMALS),
    }


def make_golden(gguf_path, prompts=GOLDEN_PROMPTS, reference=None) -> dict:
    """Golden outputs of the reference for ``prompts``: ids, greedy continuation, logit summaries.

    ``reference`` is an already loaded ``(model, tokenizer)``; loaded from ``gguf_path`` if None."""
    model, tok = reference or load_reference(gguf_path)
    rows = []
    for p in prompts:
        ids = chat_ids(tok, p)
        greedy = reference_greedy(model, ids)
        rows.append(
            {
                "prompt": p,
                "prompt_ids": ids,
                "greedy_ids": greedy,
                "greedy_text": tok.decode(greedy),
                "last_logits": logit_summary(reference_logits(model, ids)[-1]),
            }
        )
    from jaxlab.io.assets import sha256_file

    return {
        "about": "Golden outputs of Hugging Face transformers (PyTorch, float32, CPU) on the embedded "
        "SmolLM2-135M-Instruct Q4_1 GGUF. Made by scripts/make_reference.py; "
        "tests/tools/test_reference.py fails when they are stale.",
        "model_sha256": sha256_file(Path(gguf_path)),
        "made_with": {k: metadata.version(k) for k in ("transformers", "torch")},
        "greedy_tokens": GREEDY_TOKENS,
        "eos_ignored": True,
        "prompts": rows,
    }


def write_golden(data: dict, path: Path = GOLDEN_FILE) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1, ensure_ascii=False) + "\n")
    return path


def load_golden(path: Path | None = None) -> dict:
    """The golden file: ``path``, or ``reference/smollm2_135m.json`` of jaxlab's data (the wheel's, a clone's,
    or ``$JAXLAB_DATA``; a missing file is an :class:`~jaxlab.errors.AssetError` that says what to do)."""
    if path is None:
        path = data_file("reference", GOLDEN_FILE.name)
    elif not Path(path).exists():
        from jaxlab.errors import AssetError

        raise AssetError(f"golden reference file {path} not found")
    return json.loads(Path(path).read_text())


def compare_logits(ours_row: np.ndarray, summary: dict, rtol: float = 1e-4) -> tuple[bool, str]:
    """Our last-position logits against a golden summary -> (ok, one-line verdict).

    Passes when the top ids agree and every top logit is within ``rtol * max|logit|`` plus the
    rounding of the stored values. With a reduced-precision tolerance (``rtol`` above float32's,
    :data:`AGREEMENT_RTOL`) two ids whose logits lie within that tolerance of each other are a tie the
    rounding may break either way: the ids may then change places, as long as the logit at every rank
    is within the tolerance of the golden logit at that rank (the verdict names the ranks). In float32
    the ids must be identical."""
    k = len(summary["top_ids"])
    ours_top = logit_summary(ours_row, k)
    same_ids = ours_top["top_ids"] == summary["top_ids"]
    ref = np.asarray(summary["top_logits"])
    ours = np.asarray([ours_row[i] for i in summary["top_ids"]])
    tol = rtol * summary["max_abs"] + 0.5 * 10**-LOGIT_DECIMALS
    err = float(np.abs(ours - ref).max())
    ids = "identical" if same_ids else "differ"
    if not same_ids and rtol > AGREEMENT_RTOL["float32"]:
        ranked = np.asarray([ours_row[i] for i in ours_top["top_ids"]])  # our logit at each rank
        if float(np.abs(ranked - ref).max()) <= tol:
            moved = [r + 1 for r, (a, b) in enumerate(zip(ours_top["top_ids"], summary["top_ids"])) if a != b]
            same_ids, ids = True, f"identical up to near-ties (ranks {', '.join(map(str, moved))} swapped)"
    ok = same_ids and err <= tol
    verdict = "PASS" if ok else "FAIL"
    return ok, f"{verdict}: top-{len(ref)} ids {ids}, logits within tolerance: {err <= tol}"


# --------------------------------------------------------------------------------------------------
# Backend-aware golden checks
# --------------------------------------------------------------------------------------------------

#: How close two runs of *our* model must be when they differ only in how the work is arranged (cached or not,
#: batched or alone, jit or eager, one device or sharded): max |a - b| within this fraction of max |b|, per compute
#: dtype. float32 at the highest precision: 1e-4 (the sums in another order). bfloat16 keeps 8 significant bits
#: (2^-8 = 0.4 %) and every matmul's inputs are rounded to it, 30 layers deep: cached against uncached logits of the
#: embedded model differed by up to 1.3 % of the largest logit over the six golden prompts (2026-12-04, XLA:CPU
#: under the accelerator proxy), so 3 %.
AGREEMENT_RTOL = {"float32": 1e-4, "bfloat16": 3e-2}


def agreement_rtol(dtype) -> float:
    """:data:`AGREEMENT_RTOL` of ``dtype``: a dtype name, a numpy/jax dtype, or parameters (their policy's)."""
    policy = getattr(dtype, "policy", None)
    name = policy.dtype if policy is not None else np.dtype(dtype).name
    if name not in AGREEMENT_RTOL:
        raise ValueError(f"no agreement tolerance for {name}; choose one of {', '.join(AGREEMENT_RTOL)}")
    return AGREEMENT_RTOL[name]


@dataclass(frozen=True)
class GoldenCriteria:
    """What "matches the golden file" means on one backend; the thresholds are stated, not tuned."""

    backend: str
    exact: bool  # CPU: every prompt's greedy ids identical and last logits within logits_rtol
    logits_rtol: float = 1e-4  # of max|logit|, plus the stored values' rounding (compare_logits)
    min_top1_agreement: float = 0.99  # accelerators: teacher-forced argmax == the next golden token
    greedy_prefix: int = 16  # accelerators: the first greedy tokens that must be identical ...
    min_prompts: int = 5  # ... on at least this many of the golden prompts

    def describe(self, n_prompts: int = len(GOLDEN_PROMPTS)) -> str:
        if self.exact:
            return (
                f"{self.backend}: on all {n_prompts} golden prompts the {GREEDY_TOKENS} greedy ids are identical "
                f"and the top-{TOP} last logits are within {self.logits_rtol:g} (relative)"
            )
        return (
            f"{self.backend}: teacher-forced top-1 agreement >= {self.min_top1_agreement:.0%} and the first "
            f"{self.greedy_prefix} greedy tokens identical on >= {self.min_prompts} of {n_prompts} golden prompts"
        )


def golden_criteria(backend: str | None = None) -> GoldenCriteria:
    """The golden criteria of ``backend`` (default: the backend whose numerics this process follows): exact on "cpu", where the
    model runs in float32 at the highest precision; statistical on "tpu" and "gpu", where it runs in
    bfloat16 by default and a near-tie at the argmax may go the other way."""
    if backend is None:
        from jaxlab.engine.model import numerics_backend

        backend = numerics_backend()  # the accelerator proxy's "tpu" when it is on
    return GoldenCriteria(backend=backend, exact=backend == "cpu")


@dataclass
class GoldenResult:
    """The numbers of one golden check and its verdict (:func:`judge_golden`)."""

    criteria: GoldenCriteria
    ok: bool
    prompts: int
    logits_ok: int  # prompts whose last logits pass compare_logits
    greedy_identical: int  # prompts whose whole greedy continuation is identical
    prefix_identical: int  # prompts whose first criteria.greedy_prefix greedy tokens are identical
    top1_hits: int  # teacher-forced positions whose argmax is the next golden token
    top1_total: int
    lines: list[str] = field(default_factory=list)  # one per prompt

    @property
    def top1_agreement(self) -> float:
        return self.top1_hits / max(self.top1_total, 1)

    @property
    def verdict(self) -> str:
        """One line with the numbers, the thresholds and PASS/FAIL."""
        c, n = self.criteria, self.prompts
        tf = f"teacher-forced top-1 agreement {self.top1_agreement:.2%} ({self.top1_hits}/{self.top1_total})"
        if c.exact:
            return (
                f"{'PASS' if self.ok else 'FAIL'} on {c.backend} (exact): {self.greedy_identical}/{n} prompts give "
                f"identical greedy ids, {self.logits_ok}/{n} logits within {c.logits_rtol:g}; {tf}"
            )
        return (
            f"{'PASS' if self.ok else 'FAIL'} on {c.backend}: {tf}, need >= {c.min_top1_agreement:.0%}; first "
            f"{c.greedy_prefix} greedy tokens identical on {self.prefix_identical}/{n} prompts, "
            f"need >= {c.min_prompts}"
        )


def judge_golden(
    golden: dict,
    last_logits: Sequence[np.ndarray],
    greedy: Sequence[Sequence[int]],
    teacher_argmax: Sequence[Sequence[int]],
    backend: str | None = None,
) -> GoldenResult:
    """Judge measured outputs against ``golden`` (:func:`load_golden`) under the backend's criteria.

    Per golden prompt ``i``: ``last_logits[i]`` [V] at the prompt's last position, ``greedy[i]`` our
    greedy continuation (EOS ignored) and ``teacher_argmax[i]`` our argmax at each position of
    ``prompt + golden greedy ids`` that predicts a golden greedy token (``len(greedy_ids)`` of them)."""
    crit = golden_criteria(backend)
    rows = golden["prompts"]
    if not (len(last_logits) == len(greedy) == len(teacher_argmax) == len(rows)):
        raise ValueError(
            f"need one measurement per golden prompt ({len(rows)}), got {len(last_logits)} logits, "
            f"{len(greedy)} continuations, {len(teacher_argmax)} teacher-forced rows"
        )
    logits_ok = greedy_same = prefix_same = hits = total = 0
    lines = []
    for row, logits, ours, tf in zip(rows, last_logits, greedy, teacher_argmax):
        want = row["greedy_ids"]
        ok_logits, logit_line = compare_logits(np.asarray(logits), row["last_logits"], crit.logits_rtol)
        same = list(ours)[: len(want)] == want
        prefix = list(ours)[: crit.greedy_prefix] == want[: crit.greedy_prefix]
        row_hits = sum(int(a) == b for a, b in zip(tf, want))
        logits_ok, greedy_same, prefix_same = logits_ok + ok_logits, greedy_same + same, prefix_same + prefix
        hits, total = hits + row_hits, total + len(want)
        if crit.exact:
            lines.append(f"{row['prompt'][:45]:47s} {logit_line}")
        else:
            lines.append(
                f"{row['prompt'][:45]:47s} first {crit.greedy_prefix} greedy tokens "
                f"{'identical' if prefix else 'differ'}, teacher-forced top-1 {row_hits}/{len(want)}"
            )
    n = len(rows)
    if crit.exact:
        ok = logits_ok == n and greedy_same == n
    else:
        ok = hits / max(total, 1) >= crit.min_top1_agreement and prefix_same >= crit.min_prompts
    return GoldenResult(
        criteria=crit,
        ok=ok,
        prompts=n,
        logits_ok=logits_ok,
        greedy_identical=greedy_same,
        prefix_identical=prefix_same,
        top1_hits=hits,
        top1_total=total,
        lines=lines,
    )


def measure_golden(params, golden: dict | None = None) -> dict:
    """Run ``params`` on the golden prompts: {"last_logits" [P, V], "greedy" [P][n], "teacher_argmax" [P][n]}.

    One forward pass over ``prompt + golden greedy ids`` (left-padded batch) gives the last prompt
    position's logits and the teacher-forced argmax; a batched greedy :class:`~jaxlab.engine.generate.Generator`
    run gives the continuations (EOS ignored)."""
    import jax
    import jax.numpy as jnp

    from jaxlab.engine.generate import Generator
    from jaxlab.engine.kvcache import left_pad
    from jaxlab.engine.model import forward

    golden = golden or load_golden()
    rows = golden["prompts"]
    n = len(rows[0]["greedy_ids"])
    seqs = [r["prompt_ids"] + r["greedy_ids"] for r in rows]
    tokens, positions = left_pad(seqs, params.config.pad_id)  # every row ends with its n golden tokens
    logits, _ = jax.jit(forward)(params, jnp.asarray(tokens), jnp.asarray(positions))  # [P, T, V] float32
    # position -n-1 (the last prompt token) predicts greedy[0]; position -2 predicts greedy[n-1]
    predicting = logits[:, -n - 1 : -1]  # [P, n, V]
    teacher = np.asarray(jnp.argmax(predicting, axis=-1))
    last = np.asarray(logits[:, -n - 1])  # [P, V]
    out = Generator(params).generate([r["prompt_ids"] for r in rows], n, ignore_eos=True)
    return {"last_logits": last, "greedy": [list(o.generated_ids) for o in out], "teacher_argmax": teacher.tolist()}


def check_golden(params, backend: str | None = None, golden: dict | None = None) -> GoldenResult:
    """Run ``params`` on the golden prompts and judge them under the backend's criteria
    (:func:`golden_criteria`); ``result.verdict`` is one line with the numbers."""
    golden = golden or load_golden()
    return judge_golden(golden, backend=backend, **measure_golden(params, golden))


def compare_greedy(
    ours: Sequence[int], want: Sequence[int], backend: str | None = None, detail: str = ""
) -> tuple[bool, str]:
    """Our greedy tokens against the golden ones of one prompt, under the backend's criteria -> (ok, detail).

    ``ours`` is a greedy continuation (``len(ours) <= len(want)``), compared with ``want[:len(ours)]``.
    On a CPU the comparison is exact and the returned detail is the caller's ``detail`` unchanged. On TPU
    and GPU, in bfloat16, the first ``min(len(ours), criteria.greedy_prefix)`` tokens must be identical,
    and the detail says so with the numbers, e.g. "32 tokens; on tpu the first 16 must be identical, as a
    bfloat16 near-tie may flip a later one: 29 leading tokens agree". Made for
    ``check(name, *compare_greedy(ours, want, detail=...))`` (:func:`jaxlab.lab.notebook.check`)."""
    crit = golden_criteria(backend)
    if len(ours) > len(want):
        raise ValueError(f"{len(ours)} tokens to compare, but only {len(want)} golden ones")
    ours, want = [int(t) for t in ours], [int(t) for t in want[: len(ours)]]
    if crit.exact:
        return ours == want, detail
    agree = next((i for i, (a, b) in enumerate(zip(ours, want)) if a != b), len(ours))
    k = min(len(ours), crit.greedy_prefix)
    why = (
        f"on {crit.backend} the first {k} must be identical, as a bfloat16 near-tie may flip a later one: "
        f"{agree} leading tokens agree"
    )
    return agree >= k, f"{detail}; {why}" if detail else why
