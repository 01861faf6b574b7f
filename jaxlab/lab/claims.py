"""The claims the notebooks test, each with one rule: what is measured, the threshold, and the condition.

A claim quoted in two notebooks is one entry here, so it is judged by the same rule in both; where the
measurements differ (a single matmul in 01, the model's decode step in 04), the claim's ``condition``
reconciles them: the notebook measures each setting and :func:`jaxlab.lab.notebook.verdict` prints HOLDS
ONLY WHEN <condition> when some settings meet the threshold and others do not.

Fields of :class:`Claim`:

- ``quote``: the claim, in the words of its source (shortened with "..." where needed).
- ``source``: where it comes from (the seed texts in ``shared/seeds/``).
- ``measure``: what the notebook measures, in words, with its unit in ``unit``.
- ``at_least`` / ``at_most``: the claim holds where the measured value is >= / <= these.
- ``condition``: the setting in which it holds when it holds only in some ("the step is many small operations").
- ``reason``: why the threshold is where it is (the claim's own figure, a user's noticeable difference, a target
  of this lab's), printed with every verdict.
- ``steady``: True when the verdict word does not depend on the host's speed (a count, an equality, a
  format): such a verdict may sit in a cell whose output nbval compares; every other verdict sits in an
  ``nbval-ignore-output`` cell (``tests/house/test_teaching.py`` checks both).
"""

from __future__ import annotations

from dataclasses import dataclass

ARTICLE = "seed article 'The JAX Advantage' (shared/seeds/000)"
OPERATORS = "seed glossary 'JAX' for operators (shared/seeds/001)"
GLOSSARY = "seed glossary entry 'JAX, jax.jit' (shared/seeds/004)"


@dataclass(frozen=True)
class Claim:
    quote: str
    source: str
    measure: str
    unit: str = "x"
    at_least: float | None = None
    at_most: float | None = None
    condition: str = ""
    steady: bool = False
    reason: str = ""

    def __post_init__(self):
        if (self.at_least is None) == (self.at_most is None):
            raise ValueError(f"claim {self.quote[:40]!r}: give exactly one of at_least / at_most")
        if not self.reason:
            raise ValueError(f"claim {self.quote[:40]!r}: give the threshold's reason (reason=...)")

    def meets(self, value: float) -> bool:
        return value >= self.at_least if self.at_least is not None else value <= self.at_most

    def margin(self, value: float) -> str:
        """How far ``value`` is past the threshold, or short of it, in the claim's unit: 'meets by 0.5x', 'short by
        1.2x', 'meets (at the bound)'."""
        bound = self.at_least if self.at_least is not None else self.at_most
        gap = abs(value - bound)
        if gap == 0:
            return "meets (at the bound)"
        return f"{'meets' if self.meets(value) else 'short'} by {number(gap)}{unit_suffix(self.unit)}"

    @property
    def needs(self) -> str:
        bound = self.at_least if self.at_least is not None else self.at_most
        return f"{'>=' if self.at_least is not None else '<='} {number(bound)}{unit_suffix(self.unit)}"


def number(v: float) -> str:
    """Three significant figures, no exponent for everyday sizes."""
    v = float(v)
    if v == int(v) and abs(v) < 1e6:
        return str(int(v))
    if abs(v) >= 100:
        return f"{v:,.0f}"
    return f"{v:.3g}"


def unit_suffix(unit: str) -> str:
    return unit if unit in ("x", "%") else (f" {unit}" if unit else "")


CLAIMS: dict[str, Claim] = {
    # One block per notebook that first quotes the claim; keys are short snake_case names.
    # --- notebook 00 ---
    "stack_python_38": Claim(
        quote="the recommended stack includes Python 3.8+",
        source=ARTICLE,
        measure="oldest Python 3.x the installed jax accepts (its Requires-Python), as x",
        unit="",
        at_most=8,
        reason="the claim names 3.8 as the oldest Python: it holds if jax still accepts 3.8",
        steady=True,
    ),
    # --- notebook 01 ---
    "jit_speedup_2_3x": Claim(
        quote="A JIT-compiled inference pipeline can often achieve 2-3x speed improvements over eager execution",
        source=ARTICLE,
        measure="eager time / jit time per call, best of synchronized runs",
        at_least=2.0,
        reason="the claim's own lower figure: 2x of its '2-3x'",
        condition="the call is many small operations (a one-token block or decode step), whose per-operation "
        "dispatch jit removes; one large matmul runs the same kernel either way",
    ),
    "first_call_slower": Claim(
        quote="the first call will be slower (due to compilation overhead), but every subsequent call will be "
        "dramatically faster",
        source=ARTICLE,
        measure="first call (trace + compile + run) / a later call",
        at_least=10.0,
        reason="'dramatically faster' read as an order of magnitude between the first call and a later one",
        condition="the function is a model step, whose compilation takes far longer than one run; "
        "for one large matmul the run dominates and later calls are barely faster",
    ),
    "jit_cpp_bypasses_interpreter": Claim(
        quote="your Python code is transformed into efficient C++ binaries that run directly on your GPU or CPU, "
        "bypassing the interpreter entirely",
        source=ARTICLE,
        measure="Python function calls the interpreter runs per call of a jitted function",
        unit="",
        at_most=0,
        reason="'bypassing the interpreter entirely' allows no Python call at all",
        condition="the call reuses a compiled program (same shapes and dtypes): jax's C++ dispatch runs it "
        "without Python code; a new shape runs Python again to trace it",
    ),
    # --- notebook 02 ---
    "np_array_builds_batch": Claim(
        quote="np.array([preprocess_input(text) for text in batch_texts]) builds a batch of token ids",
        source=ARTICLE,
        measure="fraction of 16 two-prompt batches (the article's pair, every pair of the 6 golden prompts) "
        "that np.array turns into one [2, T] integer array",
        unit="",
        at_least=1.0,
        reason="'builds a batch' must hold for every batch, not most",
        steady=True,
    ),
    "tokenization_bottleneck": Claim(
        quote="tokenization can become a bottleneck ... especially when processing large batches of text",
        source=ARTICLE,
        measure="time to tokenize / time for the model to prefill the same number of tokens",
        at_least=0.25,
        reason="a step that takes a quarter of the model's time is one a profile would name; below that, speeding it up gains little",
        condition="the tokenizer is slow next to the model (naive BPE on long unbroken words, or any host-side "
        "tokenizer beside a fast accelerator)",
    ),
    "sanitize_stops_injection": Claim(
        quote="stripping control characters and validating token lengths in preprocessing defends against "
        "prompt injection",
        source=ARTICLE,
        measure="fraction of 8 prompt-injection strings that sanitize() and the token-length check stop (reject, or "
        "strip the instruction they smuggle in)",
        unit="",
        at_least=0.9,
        reason="a defence that lets more than one attack in ten through is not one",
        steady=True,
    ),
    # --- notebook 03 ---
    "state_passed_explicitly": Claim(
        quote="JAX programs are functional: state such as model weights and the KV cache is passed in and out "
        "explicitly so jax.jit can trace a step into a graph",
        source=GLOSSARY,
        measure="Python traces of the jitted step per input shape, over calls that each pass in new state "
        "(other weights, or the cache the previous call returned)",
        unit="traces",
        at_most=1,
        reason="one trace per shape is what a pure function of its inputs gives; a second means hidden state",
        steady=True,
    ),
    "flax_reproduces_pytorch": Claim(
        quote="A JAX/Flax model can reproduce the PyTorch reference",
        source="this lab's goal for notebook 03 (data/reference/smollm2_135m.json, from transformers)",
        measure="teacher-forced top-1 agreement with transformers over the 6 x 32 golden tokens",
        unit="",
        at_least=0.99,
        reason="float32 reimplementations disagree on a near-tie now and then; 99 % of 192 tokens allows one",
        steady=True,
    ),
    # --- notebook 04 ---
    "compile_impractical_for_chat": Claim(
        quote="the compilation overhead makes it [JAX] impractical for interactive chat",
        source=GLOSSARY,
        measure="seconds one chat request waits while its programs compile (or load from the disk cache)",
        unit="s",
        at_least=1.0,
        reason="1 s is the limit for a user's flow of thought to stay uninterrupted (Nielsen, Usability "
        "Engineering, 1993): compiling longer than that, on top of the model's own work, is a wait a chat user "
        "notices",
        condition="the request is the first of a process that has not compiled its programs (no warm-up), "
        "and the disk cache does not bring the wait under the budget",
    ),
    # --- notebook 05 ---
    "donation_writes_in_place": Claim(
        quote="Donating the cache turns a copy of the whole cache per step into an in-place write",
        source="this lab (notebook 05), after the article's 'careful management of array lifetimes' (shared/seeds/000)",
        measure="time of a one-token write into a 4096-slot float32 cache without donation / with donation",
        at_least=5.0,
        reason="a copy of the whole cache against a write of one slot should differ by far more than timing noise; 5x is well outside it",
    ),
    "kv_cache_cheaper_next_token": Claim(
        quote="A KV cache makes the next token much cheaper than recomputing the prefix, more so as the context grows",
        source="the usual promise of a KV cache (the seeds only name 'KV-cache optimization')",
        measure="time for the next token recomputing the prefix / one cached decode step, per context length",
        at_least=3.0,
        reason="'much cheaper' read as a third of the cost or less",
        condition="the context is long enough that recomputing it costs several decode steps (hundreds of "
        "tokens on a CPU)",
    ),
    # --- notebook 06 ---
    "vmap_vectorizes": Claim(
        quote="vmap automatically vectorizes a function that operates on a single input, transforming it into a "
        "function that operates on a batch of inputs",
        source=ARTICLE,
        measure="max |vmap(one-sequence step)(4 prompts) - the step on each prompt alone| over the last logits, "
        "relative to the largest logit, in units of the compute dtype's agreement tolerance "
        "(jaxlab.tools.reference.AGREEMENT_RTOL: 1e-4 in float32, 3e-2 in bfloat16)",
        unit="x the tolerance",
        at_most=1,
        reason="vmap must give the per-row results to within the dtype's own agreement tolerance, as any reordering of the same arithmetic does",
    ),
    "vmap_loads_weights_once": Claim(
        quote="With vmap, the weights are loaded once [...] This reduces memory bandwidth pressure",
        source=ARTICLE,
        measure="bytes read per generated token (XLA's cost model): vmapped step over 4 rows / one row alone",
        at_most=0.5,
        reason="4 rows reading the weights once need about a quarter of one row's bytes per token; at most half leaves room for the cache and activations, which grow with the rows",
    ),
    "explicit_prng_keys": Claim(
        quote="randomness requires explicit PRNG keys",
        source=OPERATORS,
        measure="fraction of pairs of sampled replies (seeds 0, 0, 1, 1) that are equal exactly when their "
        "seeds are equal",
        unit="",
        at_least=1.0,
        reason="reproducibility is all or nothing: every pair must follow its keys",
        steady=True,
    ),
    # --- notebook 07 ---
    "batch1_decode_memory_bound": Claim(
        quote="batch-1 decode is memory-bound",
        source="the roofline model (Williams et al., 2009) as inference guides apply it",
        measure="arithmetic intensity of one decode step (XLA's cost analysis) / this machine's measured ridge",
        at_most=1.0,
        reason="the roofline's definition: below the ridge point the step is bound by memory",
    ),
    "profiling_locates_the_time": Claim(
        quote="Profiling your specific workload with JAX's built-in profiling tools is essential to identify "
        "where parallelism provides the most benefit",
        source=ARTICLE,
        measure="agreement of the jax.profiler trace with a stopwatch: the output head's share of one decode step "
        "in the trace against the head timed alone over the step timed whole (the smaller share over the larger; "
        "1 = the same)",
        unit="",
        at_least=0.67,
        reason="within a factor of 1.5 the trace sizes an operation as a stopwatch does, so it ranks the step's "
        "parts and what speeding one up can save; further off, it could send the user to the wrong operation",
    ),
    "compile_cache_mitigates": Claim(
        quote="Compilation time can be mitigated by caching compiled functions—JAX provides tools for "
        "serializing and reloading compiled executables, avoiding recompilation on subsequent runs",
        source=ARTICLE,
        measure="compile seconds of a fresh process, filled persistent cache / empty cache (a tenth saved or more)",
        at_most=0.9,
        reason="saving a tenth of the compile time is the least a user would notice",
    ),
    # --- notebook 08 ---
    "pmap_shards_the_computation": Claim(
        quote="JAX's pmap function extends this parallelism across multiple devices, sharding the computation",
        source=ARTICLE,
        measure="devices that each computed their share of the batch under pmap, equal to the one-device result",
        unit="devices",
        at_least=2,
        reason="sharding needs two devices at least, each computing its part correctly",
        steady=True,
    ),
    "pmap_helps_when_one_device_is_not_enough": Claim(
        quote="when a single GPU isn't enough, JAX's pmap function extends this parallelism across multiple devices",
        source=ARTICLE,
        measure="decode throughput of SmolLM2 under jax.pmap on every device over one device, same batch",
        at_least=1.5,
        reason="half again the one-device throughput: less does not pay for the extra devices",
    ),
    "pmap_overhead_bottleneck": Claim(
        quote="the communication overhead of pmap can become a bottleneck if not managed properly",
        source=ARTICLE,
        measure="share of SmolLM2's tensor-parallel decode step spent in its all-reduces: their count in the "
        "compiled step x one all-reduce timed alone, over the step timed whole",
        unit="%",
        at_least=50.0,
        reason="a bottleneck sets the pace: communication taking half the step or more",
        condition="each all-reduce's fixed latency is large next to a device's share of the step: a small model "
        "split over chips whose steps take microseconds (not devices simulated on one CPU, whose steps take far "
        "longer than a copy between threads)",
    ),
    "softmax_needs_synchronization": Claim(
        quote="softmax operations involve global reductions that require synchronization",
        source=ARTICLE,
        measure="collectives the compiled program needs for attention's softmax, per layer",
        unit="collectives",
        at_least=1,
        reason="one collective is the least a global reduction split across devices needs",
        condition="one softmax row is split across devices (the cache's sequence axis sharded); with whole heads on "
        "each device (tensor parallelism) the softmax needs none",
        steady=True,
    ),
    # --- notebook 09 ---
    "quantization_reduces_memory": Claim(
        quote="reduced operational costs",
        source=ARTICLE + ", of JAX inference with the model quantization it names",
        measure="bytes in float32 over bytes in the quantized format, scales included",
        at_least=2.0,
        reason="half the memory halves the chips (or doubles the batch) a deployment needs: the least reduction that changes its cost",
        steady=True,
    ),
    "quantization_lowers_latency": Claim(
        quote="lower latency, higher throughput",
        source=ARTICLE + ", of JAX inference with the model quantization it names",
        measure="speed against float32 measured here (> 1 is faster)",
        at_least=1.1,
        reason="10 % faster is outside run-to-run noise on a quiet machine and is a gain a user sees",
        condition="the format, and the way its product is written, meet a fast integer kernel of the backend at hand",
    ),
    "quantization_ecosystem_less_mature": Claim(
        quote="the ecosystem for local deployment (quantization, KV-cache management) is less mature",
        source=OPERATORS,
        measure="tokens/s at batch 1 of jaxlab's fastest quantized format over llama.cpp's fastest (Q8_0 or Q4_1): "
        "same model, same host, one run (`jaxlab bench --quant --llama-bench`), best repetition of each",
        at_most=0.8,
        reason="llama.cpp is the mature local-deployment stack the glossary has in mind: quantized models running at "
        "most four-fifths as fast on JAX's stack is a gap wider than run-to-run noise",
    ),
    # --- notebook 10 ---
    "speculative_identical_output": Claim(
        quote="speculative decoding ... with identical output",
        source="the usual claim for speculative decoding, which the seed article (shared/seeds/000) only names",
        measure="prompts whose speculative tokens differ from plain greedy decoding's",
        unit="prompts",
        at_most=0,
        reason="'identical output' allows no differing prompt",
        steady=True,
    ),
    "speculative_free_speedup": Claim(
        quote="speculative decoding is a free speed-up",
        source="the usual claim for speculative decoding, which the seed article (shared/seeds/000) only names",
        measure="decode speed against plain greedy decoding, batch 1, n-gram drafts, measured here",
        at_least=1.3,
        reason="'a free speed-up' read as one a user notices: 30 % faster or more",
        condition="the answer copies from the prompt, so most drafts are kept; open-ended writing gets about one "
        "token per model call and gains nothing",
    ),
    # --- notebook 11 ---
    "continuous_batching_throughput": Claim(
        quote="continuous batching gives several times the throughput of static batching",
        source="the usual claim for vLLM and its descendants (Kwon et al., arXiv:2309.06180)",
        measure="output tokens/s, continuous engine / static batches, same trace and KV memory",
        at_least=2.0,
        reason="'several times' read as at least twice",
        condition="the trace is long and its outputs long-tailed, so static batches wait on their longest row",
    ),
    "continuous_batching_ttft_p99": Claim(
        quote="continuous batching gives a lower p99 time to first token",
        source="the usual claim for vLLM and its descendants (Kwon et al., arXiv:2309.06180)",
        measure="p99 time to first token, static / continuous, same trace",
        at_least=1.0,
        reason="lower is any improvement: above 1 means continuous batching's p99 is lower",
        condition="requests arrive while a static batch is still running",
    ),
    "prefix_reuse_ttft": Claim(
        quote="prefix caching is almost a free lunch and won't change model outputs",
        source="vLLM's design notes, 'Automatic Prefix Caching' (docs.vllm.ai, design/v1/prefix_caching)",
        measure="median time to first token, reuse off / on, requests sharing a system prompt (the outputs are "
        "checked identical beside it)",
        at_least=1.2,
        reason="a lunch is a gain a user notices: the median first token at least a fifth sooner; 'free' and "
        "'won't change model outputs' are the identical tokens, checked beside the verdict",
        condition="the shared prompt is most of each request's work and requests do not wait for slots",
    ),
    # --- notebook 12 ---
    "malformed_inputs_handled": Claim(
        quote="malformed inputs are a failure mode a server must handle defensively",
        source=ARTICLE,
        measure="bad requests answered with their 4xx before reaching the model, the server serving on",
        unit="%",
        at_least=100.0,
        reason="one malformed request that reaches the model or stops the server is one too many",
        steady=True,
    ),
    "jax_traceback_error": Claim(
        quote="`except jax.errors.TracebackError` catches JAX's errors",
        source=ARTICLE,
        measure="real JAX errors that such an except clause catches",
        unit="%",
        at_least=100.0,
        reason="an except clause that misses some errors does not 'catch JAX's errors'",
        steady=True,
    ),
    "rate_limit_protects": Claim(
        quote="rate limiting protects the service (here in the server, not a separate gateway)",
        source=ARTICLE,
        measure="a well-behaved client's answer time while a second client floods the server, over its time alone",
        at_most=1.25,
        reason="protected means the other clients barely notice the flood: a quarter slower at most, about the "
        "spread of repeated runs on a shared machine",
        condition="the flooder has used up its own allowance (its bucket), and its refused requests cost the "
        "server little next to the model's work",
    ),
    # --- notebook 13 ---
    "pallas_kernels_faster": Claim(
        quote="pure JAX implementations ... before later Pallas kernels optimized them",
        source=GLOSSARY,
        measure="attention time, the XLA formulation / the Pallas flash kernel, compiled for the attached chip "
        "(> 1: the kernel is faster)",
        at_least=1.0,
        reason="'optimized' means no slower than the XLA formulation it replaces",
        condition="the kernel is compiled for a TPU or GPU (interpret mode on a CPU is a simulator) and the shape is "
        "one where skipping masked blocks and never writing the scores matter",
    ),
    "pallas_exact_attention": Claim(
        quote="FlashAttention, an IO-aware exact attention algorithm",
        source="Dao et al., arXiv:2205.14135, the kernel notebook 13 writes in Pallas",
        measure="largest |Pallas kernel - XLA attention| over the settings, float32",
        unit="",
        at_most=1e-5,
        reason="'exact' at float32: differences of float32 rounding, 1e-5 at these magnitudes",
    ),
    # --- notebook 14 ---
    "jax_bert_faster_than_pytorch": Claim(
        quote="compiled JAX BERT runs 2-3x faster than PyTorch",
        source=OPERATORS,
        measure="tokens/s, jitted jaxlab encoder / PyTorch eager BertModel, by batch x length",
        at_least=2.0,
        reason="the claim's own lower figure: 2x of its '2-3x'",
        condition="the batch and length are ones where XLA's kernels outrun PyTorch's on the host at hand",
    ),
    "dense_vs_bm25_recall": Claim(
        quote="dense retrieval finds the gold passage at least as often as BM25 (recall@5)",
        source="the lab's question on dense against lexical retrieval (Sentence-BERT, arXiv:1908.10084)",
        measure="recall@5, dense / BM25, paraphrased questions",
        at_least=1.0,
        reason="'at least as often' is a ratio of 1",
        condition="the questions paraphrase the docs more than they quote them",
    ),
    "rag_more_correct": Claim(
        quote="retrieval makes a small model's answers about an API correct more often",
        source=ARTICLE,
        measure="questions whose answer names the gold fact, with 3 retrieved passages minus without",
        unit="questions",
        at_least=1.0,
        reason="one more correct answer of the same questions is the least 'more often' can mean",
    ),
    # --- notebook 15 ---
    "finetune_loss_grad_jit": Claim(
        quote="a loss function, grad and a jitted update step fine-tune the model",
        source=OPERATORS,
        measure="JSON match on unseen test items after LoRA fine-tuning (the base model: at most 20 %)",
        unit="%",
        at_least=60.0,
        reason="a model that answers most unseen items right (60 %) from one that answers at most 20 % has learnt the task",
        condition="the adapter was trained for enough steps",
    ),
    "remat_trades_memory": Claim(
        quote="lax primitives (jax.checkpoint) control what is materialised, trading memory for time",
        source=OPERATORS,
        measure="temporary memory of the train step, remat on / off",
        at_most=0.8,
        reason="a trade worth its time must save a fifth of the step's temporary memory or more: less rarely lets a larger batch or model fit, and remat costs a tenth or more of step time",
        condition="the activations kept for the backward pass are a large part of the step's memory",
    ),
    "export_savedmodel_onnx": Claim(
        quote="for vLLM or llama.cpp, a JAX model must be exported to SavedModel or ONNX",
        source=OPERATORS,
        measure="exports in neither SavedModel nor ONNX that llama.cpp ran with jaxlab's greedy tokens",
        unit="files",
        at_most=0,
        reason="one runtime running an export in neither format disproves 'must'",
        steady=True,
    ),
    # --- notebook 16 ---
    "xla_compiles_tpu_kernels": Claim(
        quote="XLA (Accelerated Linear Algebra) compiles JAX functions into efficient GPU/TPU kernels.",
        source=OPERATORS,
        measure="the lab's programs libtpu compiled for a TPU on this CPU (SmolLM2's decode step for v5e-1, the "
        "three Pallas kernels through Mosaic, the tensor-parallel decode for v5e-8), as a fraction of those asked",
        unit="",
        at_least=1,
        reason="'compiles JAX functions into TPU kernels' must hold for every program asked",
        steady=True,
    ),
    # --- notebook 17 ---
    "functional_style_complicates_serving": Claim(
        quote="the functional style complicates stateful model serving",
        source=OPERATORS,
        measure="programs compiled once requests that carry state between steps (a grammar's place in a JSON schema "
        "or a regex, kept on the host) join a warmed-up batch of free requests",
        unit="programs",
        at_least=1,
        reason="the lab's stateful requests recompiling anything would be the complication the claim names",
        steady=True,
    ),
    "grammar_makes_output_valid": Claim(
        quote="a grammar applied as a token mask makes a model's replies match a JSON schema, without training",
        source="this lab (notebook 17), after the structured outputs of vLLM and sglang-jax",
        measure="replies to the extraction task, greedy through the schema's mask, that are schema-valid",
        unit="",
        at_least=1,
        reason="a mask that lets one invalid reply through does not 'make' replies match",
        steady=True,
    ),
    "grammar_mask_costs_little": Claim(
        quote="a masked decode step costs at most 1.15x the unconstrained step",
        source="this lab's target for structured output (jaxlab bench --structured)",
        measure="median decode step with every row constrained / every row free, one engine",
        at_most=1.15,
        reason="the structured-output issue's target: within 15 % of the free step",
    ),
    # --- notebook 18 ---
    "torchax_runs_pytorch_as_jax": Claim(
        quote="the first external vLLM TPU backend translated PyTorch into JAX through TorchAX",
        source=GLOSSARY,
        measure="greedy tokens of transformers' SmolLM2 run as JAX through torchax (jitted) that equal "
        "transformers' own eager PyTorch tokens, over the golden prompts, as a fraction",
        unit="",
        at_least=1,
        reason="a translation that changes one greedy token is not the same model",
        steady=True,
    ),
    "jax_native_engine_pays": Claim(
        quote="... and why SGLang-JAX exists as a separate JAX-native engine",
        source=GLOSSARY,
        measure="time through torchax / time through jaxlab's native Flax model, same model, prompt, policy and "
        "host, one run",
        at_least=1.2,
        reason="a second, native implementation is worth writing only where the translated model is noticeably "
        "slower: 1.2x, a fifth more time, the smallest speed-up the lab's other targets count",
        condition="the traced eager code does work the native program does not (masks and rotary tables built for "
        "the whole prompt at prefill); where both programs are bound by the same weight reads (a decode step), "
        "the translation costs nothing",
    ),
    "pure_jax_first_for_new_layers": Claim(
        quote="Initial Qwen3.5 TPU support added pure JAX implementations of causal Conv1D and Gated DeltaNet",
        source=GLOSSARY,
        measure="largest relative error of the pure-JAX Qwen3.5 (a tiny random configuration) against "
        "transformers' PyTorch implementation, over prefill and step-by-step decode logits",
        unit="",
        at_most=1e-5,
        reason="float32 parity, the bar every model and kernel of the lab meets: 1e-5 relative",
        steady=True,
    ),
    "pallas_kernels_optimized_them": Claim(
        quote="... before later Pallas kernels optimized them",
        source=GLOSSARY,
        measure="the chunked Gated DeltaNet's time in pure JAX / in the Pallas kernel, on a TPU",
        at_least=1.0,
        reason="'optimized' means the kernel is at least as fast as the pure JAX it replaced",
    ),
}


def claim(key: str) -> Claim:
    try:
        return CLAIMS[key]
    except KeyError:
        raise KeyError(f"no claim {key!r} in jaxlab/lab/claims.py: add it there (quote, source, measure, threshold)")
