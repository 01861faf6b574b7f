"""The build-the-engine track: your pieces from notebooks 04, 05, 06 and 11, assembled into one generation loop that
serves requests with SmolLM2-135M and must give the golden tokens.

Solve the exercises of the four notebooks, save them, then::

    jaxlab check track            # reads 04_*.ipynb, 05_*, 06_* and 11_* here, else in notebooks/
    jaxlab check track FOLDER     # ... in FOLDER

It runs each notebook's Exercises cells as ``jaxlab check NN`` does (after the notebook's own imports) and takes your
functions from them; checks each one against the engine's reference (the notebooks' own checks: a failing piece is
named with its notebook, and the engine is not run); then serves the first golden prompts with :func:`generate` built
from your functions, more requests than slots, and compares every request's tokens with the golden ones.

Where each piece works in one step of :func:`generate`:

====================  ========  =============================================================================
piece                 notebook  its job
====================  ========  =============================================================================
``my_admit``          11        the scheduler: which waiting requests start now, in which slot, with which pages
``my_allocate``       11        the pages of each request it admits (``my_admit`` calls it)
``my_pad_to_bucket``  04        pads each new prompt to its bucket (one compiled prefill per bucket)
``my_cache_update``   05        every K, V and position write into the cache (the cache carries it)
``my_sample``         06        picks each new request's first token from its prompt's last logits
``my_decode_step``    04        makes every later token: one per running request, all slots in one call
====================  ========  =============================================================================

The rest is the engine's: the model (:func:`jaxlab.forward`, the one forward pass, which your decode step calls; the
prompt's pass is the engine's :func:`~jaxlab.engine.steps.next_logits`) and the cache
(:func:`~jaxlab.engine.kvcache.init_cache`, whose ``slot_write`` hook takes your cache write). Each slot holds a
batch-1 cache of its own (every cache array stacked on a leading slot axis), and your decode step runs on all slots
at once under ``jax.vmap`` (notebook 06), so a request starts in a slot the moment another one frees it, while the
others keep decoding (continuous batching, notebook 11). Pages are the memory budget: a request is admitted only when
pages for its prompt and all its new tokens are free, reserved at once, so nothing is ever preempted (the engine of
notebook 11 takes pages as positions are written and preempts when they run out: it admits more, with more rules).
"""

from __future__ import annotations

import contextlib
import io
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from jaxlab.engine.kvcache import init_cache
from jaxlab.engine.plan import PREFILL_BUCKETS, bucket
from jaxlab.engine.steps import next_logits
from jaxlab.errors import JaxlabError

#: The served requests: the first golden prompts, each asking for this many greedy tokens. The second finishes
#: first, and the third, which waited for a slot, starts in its place while the first is still decoding.
MAX_NEW = (8, 4, 8)
SLOTS = 2  # requests running at once
PAGE_SIZE = 16  # positions per page
PAGES = 7  # free pages (112 positions): the first two requests take 3 each; the third, 4, once the second is done
BUDGET = 128  # tokens one step may compute: the new prompts and one token per decoding request
BUCKETS = PREFILL_BUCKETS  # the prompt lengths compiled for (32, 64, ...), the engine's


@dataclass(frozen=True)
class Piece:
    name: str  # the function, as the notebook names it
    number: str  # its notebook
    check: str  # the check of that notebook's exercise module that judges it


PIECES = (
    Piece("my_pad_to_bucket", "04", "check_pad_to_bucket"),
    Piece("my_decode_step", "04", "check_decode_step"),
    Piece("my_cache_update", "05", "check_cache_update"),
    Piece("my_sample", "06", "check_sample"),
    Piece("my_allocate", "11", "check_allocate"),
    Piece("my_admit", "11", "check_admit"),
)
NOTEBOOKS = tuple(dict.fromkeys(p.number for p in PIECES))


class PieceError(Exception):
    """One of your pieces raised, or returned what the loop cannot use: ``piece`` names it."""

    def __init__(self, piece: str, message: str):
        super().__init__(message)
        self.piece = piece


@dataclass
class Request:
    id: int
    prompt: list[int]
    max_new: int
    golden: list[int]  # the reference's greedy tokens for this prompt
    tokens: list[int] = field(default_factory=list)  # what your engine made
    slot: int | None = None
    pages: list[int] = field(default_factory=list)


def golden_requests(max_new=MAX_NEW) -> list[Request]:
    """One request per entry of ``max_new``: the golden prompts in order (data/reference)."""
    from jaxlab.tools.reference import load_golden

    rows = load_golden()["prompts"]
    return [Request(i, r["prompt_ids"], n, r["greedy_ids"]) for i, (r, n) in enumerate(zip(rows, max_new))]


@contextlib.contextmanager
def blame(piece: str, pieces: dict):
    """An exception inside turns into a :class:`PieceError` naming the piece that raised it: the innermost of your
    functions in the traceback (your cache write inside your decode step is the cache write), else ``piece``."""
    try:
        yield
    except PieceError:
        raise
    except Exception as e:
        codes = {getattr(fn, "__code__", None): name for name, fn in pieces.items()}
        tb, culprit = e.__traceback__, piece
        while tb is not None:
            culprit = codes.get(tb.tb_frame.f_code, culprit)
            tb = tb.tb_next
        first = (str(e).strip().splitlines() or [""])[0]
        raise PieceError(culprit, f"raised {type(e).__name__}: {first}") from e


@jax.jit
def put_row(rows, slot, one):
    """The slot caches with row ``slot`` of every array replaced by the batch-1 cache ``one``."""
    return jax.tree.map(lambda a, b: a.at[slot].set(b), rows, one)


def admitted(plan, waiting, free_slots, free_pages) -> list[tuple[int, list[int]]]:
    """Your scheduler's plan as (slot, pages) pairs, or a PieceError saying what is wrong with it."""
    try:
        plan = [(int(slot), [int(p) for p in pages]) for slot, pages in plan]
    except Exception:
        raise PieceError("my_admit", f"returned {plan!r}: give a list of (slot, pages) pairs") from None
    slots, pages = [s for s, _ in plan], [p for _, got in plan for p in got]
    if len(plan) > len(waiting):
        raise PieceError("my_admit", f"admitted {len(plan)} requests, but only {len(waiting)} wait")
    if len(set(slots)) < len(slots) or not set(slots) <= set(free_slots):
        raise PieceError("my_admit", f"admitted into slots {slots}, but the free slots are {free_slots}")
    if len(set(pages)) < len(pages) or not set(pages) <= set(free_pages):
        raise PieceError("my_admit", f"handed out pages {pages}, but the free pages are {free_pages}")
    return plan


def generate(pieces: dict, params, requests: list[Request], slots=SLOTS, pages=PAGES, budget=BUDGET, log=None):
    """Serve ``requests`` with your pieces (a dict: name -> function; see the module's docstring): each request's
    ``tokens`` fill in. ``log`` (e.g. ``print``) gets a line when requests start or finish."""
    log = log or (lambda line: None)
    pad, step, sample, admit = (pieces[n] for n in ("my_pad_to_bucket", "my_decode_step", "my_sample", "my_admit"))
    cfg = params.config
    length = bucket(max(len(r.prompt) for r in requests), BUCKETS) + max(r.max_new for r in requests)
    fresh = init_cache(cfg, 1, length, slot_write=pieces["my_cache_update"])  # one request's; every write is yours
    rows = jax.tree.map(lambda a: jnp.stack([a] * slots), fresh)  # slot s's cache: row s of every array [R, ...]
    prefill = jax.jit(next_logits)  # the engine's pass over a prompt [1, L] -> (its last logits [1, V], cache)
    decode = jax.jit(jax.vmap(step, in_axes=(None, 0, 0, 0)), donate_argnums=(3,))  # your step, every slot at once
    waiting, running = deque(requests), {}  # running: slot -> request
    free_slots, free_pages = list(range(slots)), list(range(1, pages + 1))  # page 0 is the null page
    n = 0
    while waiting or running:
        n += 1
        # 1. your scheduler: which waiting requests start now, in which slot, with which of your allocator's pages
        queue = [(len(r.prompt), r.max_new) for r in waiting]  # first come first
        with blame("my_admit", pieces):
            plan = admit(queue, list(free_slots), list(free_pages), PAGE_SIZE, budget, len(running))
        started = []
        for slot, got in admitted(plan, waiting, free_slots, free_pages):
            r = waiting.popleft()
            r.slot, r.pages = slot, got
            free_slots.remove(slot)
            free_pages = [p for p in free_pages if p not in got]
            started.append(r)
        if not started and not running:
            raise PieceError(
                "my_admit",
                f"admitted nothing with every slot and page free: request {waiting[0].id} would wait forever",
            )
        # 2. each new prompt, padded by your bucketing, through the model into a fresh cache: its slot's row
        last = []  # [V] each
        for r in started:
            with blame("my_pad_to_bucket", pieces):
                tokens, positions = (np.asarray(a, np.int32) for a in pad(r.prompt, BUCKETS, cfg.pad_id))  # [L], [L]
            if tokens.shape != positions.shape or not len(r.prompt) <= len(tokens) <= length - r.max_new:
                raise PieceError(
                    "my_pad_to_bucket",
                    f"padded a {len(r.prompt)}-token prompt to {tokens.shape} tokens "
                    f"and {positions.shape} positions; the buckets are {BUCKETS}",
                )
            with blame("my_cache_update", pieces):
                logits, cache = prefill(params, jnp.asarray(tokens)[None], jnp.asarray(positions)[None], fresh)
            rows = put_row(rows, r.slot, cache)
            last.append(logits[0])
        # 3. your sampler picks their first tokens, each row with its own key (temperature 0: greedy)
        if started:
            keys = jnp.stack([jax.random.fold_in(jax.random.key(r.id), len(r.prompt)) for r in started])  # [A]
            with blame("my_sample", pieces):
                first = np.asarray(sample(jnp.stack(last), keys, jnp.zeros(len(started), jnp.float32)))  # [A]
            if first.shape != (len(started),):
                raise PieceError("my_sample", f"returned shape {first.shape} for {len(started)} rows")
            for r, t in zip(started, first):
                r.tokens.append(int(t))
            log(
                f"step {n}: "
                + "; ".join(f"request {r.id} starts in slot {r.slot} with pages {r.pages}" for r in started)
            )
        # 4. your decode step: one more token for each request that was running already, every slot in one call
        going = {s: r for s, r in running.items() if len(r.tokens) < r.max_new}
        if going:
            token = np.full((slots, 1), cfg.pad_id, np.int32)  # [R, 1]: an idle slot feeds padding (position -1)
            pos = np.full((slots, 1), -1, np.int32)  # [R, 1]
            for s, r in going.items():
                token[s, 0], pos[s, 0] = r.tokens[-1], len(r.prompt) + len(r.tokens) - 1
            with blame("my_decode_step", pieces):
                nxt, rows = decode(params, jnp.asarray(token), jnp.asarray(pos), rows)  # [R, 1], caches
            nxt = np.asarray(nxt).reshape(slots, -1)
            for s, r in going.items():
                r.tokens.append(int(nxt[s, 0]))
        # 5. a finished request frees its slot and its pages at once
        running.update({r.slot: r for r in started})
        for s, r in list(running.items()):
            if len(r.tokens) >= r.max_new:
                del running[s]
                free_slots = sorted(free_slots + [s])
                free_pages += r.pages  # to the back of the free list: the least recently freed go out first
                log(f"step {n}: request {r.id} done ({len(r.tokens)} tokens): slot {s} and pages {r.pages} free")
    return requests


def collect(folder: Path | None) -> tuple[dict, dict, list[str]]:
    """Your pieces from the saved notebooks in ``folder`` (default: here, else notebooks/) -> (name -> function,
    number -> the notebook's path, one line per exercise cell that failed)."""
    from jaxlab.lab.checking import definitions, find_notebook

    if folder is not None and not Path(folder).is_dir():
        raise JaxlabError(f"{folder}: not a folder; give the folder that holds your saved 04, 05, 06 and 11")
    paths = {nn: find_notebook(nn, where=folder) for nn in NOTEBOOKS}
    pieces, notes = {}, []
    for nn, path in paths.items():
        ns, problems = definitions(nn, path)
        notes += [f"{path.name}, {p}" for p in problems]
        pieces.update({p.name: ns.get(p.name) for p in PIECES if p.number == nn})
    return pieces, paths, notes


def check_pieces(pieces: dict, paths: dict, out) -> int:
    """Each piece through its notebook's check: one PASS or FAIL line each -> how many failed."""
    from jaxlab.lab.checking import exercise_modules

    modules, failed = exercise_modules(), 0
    for p in PIECES:
        fn, where = pieces.get(p.name), paths.get(p.number, f"notebook {p.number}")
        if not callable(fn):
            ok, said = False, f"no function {p.name} in {getattr(where, 'name', where)}: is its exercise cell there?"
        else:
            buf = io.StringIO()
            try:
                with contextlib.redirect_stdout(buf):
                    ok = getattr(modules[f"nb{p.number}"], p.check)(fn)
                said = (buf.getvalue().strip().splitlines() or [""])[-1].removeprefix("FAIL: ")
            except Exception as e:  # what it returned broke the comparison itself
                ok, said = False, f"its check raised {type(e).__name__}: {(str(e).strip().splitlines() or [''])[0]}"
        failed += not ok
        detail = f"  -  {said} (fix it in {getattr(where, 'name', where)})" if not ok else ""
        out.write(f"{'PASS' if ok else 'FAIL'}  {p.number} {p.name}{detail}\n")
    return failed


def check_engine(pieces: dict, out, paths: dict | None = None) -> int:
    """Run :func:`generate` with your pieces on the golden requests and judge each request's tokens -> failures."""
    from jaxlab.engine import loading
    from jaxlab.tools.reference import compare_greedy

    paths = paths or {}
    out.write(
        f"your engine: {len(MAX_NEW)} golden prompts asking for {', '.join(map(str, MAX_NEW))} greedy tokens, "
        f"{SLOTS} slots, {PAGES} pages of {PAGE_SIZE} positions, a budget of {BUDGET} tokens per step\n"
    )
    model = loading.load()
    try:
        done = generate(pieces, model.params, golden_requests(), log=lambda s: out.write(f"  {s}\n"))
    except PieceError as e:
        p = next(p for p in PIECES if p.name == e.piece)
        where = getattr(paths.get(p.number), "name", f"notebook {p.number}")
        out.write(f"FAIL  {p.number} {p.name}  -  in the engine, it {e} (fix it in {where})\n")
        return len(MAX_NEW)  # no request was served
    failed = 0
    for r in done:
        ok, detail = compare_greedy(r.tokens, r.golden, detail=f"its {len(r.tokens)} tokens are the golden ones")
        if not ok:
            at = next((i for i, (a, b) in enumerate(zip(r.tokens, r.golden)) if a != b), len(r.tokens))
            detail = f"{detail}: token {at} is {r.tokens[at] if at < len(r.tokens) else None}, golden {r.golden[at]}"
        failed += not ok
        out.write(f"{'PASS' if ok else 'FAIL'}  request {r.id}  -  {detail}\n")
    return failed


def run(folder: Path | None, out) -> int:
    """``jaxlab check track [FOLDER]``: exit 0 only when every piece passes and the engine gives the golden tokens."""
    pieces, paths, notes = collect(folder)
    out.write("the build-the-engine track: your pieces from " + ", ".join(str(p) for p in paths.values()) + "\n")
    for note in notes:
        out.write(f"note  {note}\n")
    failed = check_pieces(pieces, paths, out)
    total = len(PIECES) + len(MAX_NEW)
    if failed:
        out.write(f"{len(PIECES) - failed} of {total} pass; the engine was not run: fix the pieces that fail first\n")
        return 1
    failed = check_engine(pieces, out, paths)
    out.write(f"{total - failed} of {total} pass" + ("" if failed else ": your engine gives the golden tokens") + "\n")
    return 1 if failed else 0
