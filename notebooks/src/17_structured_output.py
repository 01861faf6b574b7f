# %% [markdown]
# # 17 · Structured output: a grammar becomes a mask inside the compiled step
#
# *About 30 minutes.* A program that reads a model's reply wants JSON that matches a schema, or one word from a
# list, not prose. Notebook 15 taught SmolLM2 the extraction task by training an adapter; this notebook gets
# schema-valid JSON from the **base** model with no training at all, by never letting it pick a token that would
# break the schema. At every step a grammar says which of the 49,152 tokens may come next; the compiled decode
# step sets every other token's logit to −∞ before it chooses. The engine, `jaxlab generate --json-schema`, and
# the server's `response_format` all run this one mechanism.
#
# **Learning goals**
#
# - Turn a regex into a character automaton, and see why the *token* automaton is harder: one BPE token can close
#   a string and open the next key (`'",'`), so the grammar walks each token's bytes.
# - Read a grammar's mask: a bitmask of `ceil(V / 32)` int32 words per row, unpacked inside the jitted step.
# - Check that a constrained row changes nothing for the free rows beside it, and that mixing them compiles
#   nothing new (the grammar's state lives on the host and enters the step as an argument).
# - Measure what the mask costs per step, and what it buys: the base model's schema-valid replies, without and
#   with the schema, beside a fine-tuned adapter.
#
# Links: [llguidance](https://github.com/guidance-ai/llguidance) (the grammar engine jaxlab uses) ·
# [Efficient Guided Generation (Willard & Louf, 2023)](https://arxiv.org/abs/2307.09702) ·
# [XGrammar (Dong et al., 2024)](https://arxiv.org/abs/2411.15100) ·
# [OpenAI structured outputs](https://platform.openai.com/docs/guides/structured-outputs) ·
# [JSON Schema](https://json-schema.org/understanding-json-schema)

# %% tags=["nbval-ignore-output"]
import json
import re

import matplotlib.pyplot as plt
import numpy as np

import jaxlab
from jaxlab.bench.structured import step_cost
from jaxlab.engine.continuous import Engine
from jaxlab.engine.grammar import Constraint, Matcher, allow_all, mask_logits
from jaxlab.io.assets import data_file
from jaxlab.io.tokenizer import prompt_ids
from jaxlab.lab import structured
from jaxlab.lab.notebook import check, setup, show_source, stored, table, verdict
from jaxlab.tools.profile import CompileCounter
from jaxlab.train.data import read_jsonl
from jaxlab.train.task import SCHEMA, fields_exact, schema_valid

setup()
m = jaxlab.load()
tok, V = m.tokenizer, m.config.vocab_size
items = read_jsonl(data_file("finetune", "test.jsonl"))[:8]
prompts = [prompt_ids(tok, e["prompt"]) for e in items]
engine = Engine(m.params, tok, slots=8, context=256)
print(items[0]["prompt"], "\n->", items[0]["answer"])

# %% [markdown]
# ## 1 · What the base model writes
#
# The task (notebook 15's): pull a person's name, age, city and job out of a sentence as JSON with exactly those
# four keys. Eight test items, greedy, through the continuous engine. **Predict first:** how many of the eight
# replies are valid JSON with exactly the four keys, of the right types?

# %% tags=["nbval-ignore-output"]
free = engine.generate(prompts, 64)
for r in free[:3]:
    print(repr(r.text[:110]))
free_valid = sum(schema_valid(r.text) for r in free) / len(free)
free_fields = sum(fields_exact(r.text, e["answer"]) for r, e in zip(free, items)) / len(items)
print(f"schema-valid: {free_valid:.0%}   fields exactly right: {free_fields:.0%}")

# %% [markdown]
# The model knows what the fields are; it is the *form* that fails: a preamble ("JSON:"), indentation a reader
# would like but then more text after the object, a key it invented, an age written as a word. The schema below
# is the contract a program wants (`jaxlab.train.task.SCHEMA`):

# %%
print(json.dumps(SCHEMA))


# %% [markdown]
# ## 2 · From a regex to a token automaton
#
# Start smaller: an age, `[1-9][0-9]?`. As characters, a regex is an automaton: from the start, a digit 1–9 moves
# to a state where one more digit 0–9 is allowed, or the end. Written as a table of states:

# %%
def char_automaton_allows(pattern, prefix, alphabet="0123456789ab"):
    """The characters that may follow ``prefix`` so the text can still match ``pattern`` in full."""
    partial = re.compile(pattern)
    return [c for c in alphabet if any(partial.fullmatch(prefix + c + rest) for rest in ("", "0", "00"))]


for prefix in ("", "4", "42"):
    print(f"after {prefix!r:5}: {char_automaton_allows('[1-9][0-9]?', prefix)}")

# %% [markdown]
# After `'42'` no character may follow: only the end. The model does not write characters, though; it writes
# tokens, and the mask must allow exactly the tokens whose *bytes* keep the text inside the grammar, all of them.
# For numbers SmolLM2 is kind (its tokenizer writes every digit as a token of its own); for JSON it is not: the
# vocabulary has a hundred and more tokens that close one element and open the next.

# %%
spanning = structured.boundary_tokens(tok, V)
print(f"{len(spanning)} tokens hold a double quote next to other characters, e.g.",
      [t for t in spanning if t in ('",', '":', ' "', '"}', '"]', '":"', '","')])

# %% [markdown]
# A grammar engine walks each candidate token's bytes through the automaton. jaxlab uses
# [llguidance](https://github.com/guidance-ai/llguidance) (a Rust library: one wheel, no dependencies), wrapped by
# `jaxlab.engine.grammar`: a `Constraint` (a JSON schema, any JSON object, a regex, a list of choices) and a
# `Matcher`, one request's place in its grammar. `fill` writes the allowed next tokens into a bitmask row,
# `advance` moves past the token the model chose. For the age regex, at the start and after `'4'`:

# %%
age = Matcher(Constraint.regex("[1-9][0-9]?"), tok, V)
row = allow_all(1, V)[0]
age.fill(row)
first = [tok.decode([i]) for i in range(V) if (row[i // 32] >> (i % 32)) & 1]
age.advance(tok.encode("4")[0])
age.fill(row)
after = [tok.decode([i]) for i in range(V) if (row[i // 32] >> (i % 32)) & 1]
print(f"start: {len(first)} tokens allowed, e.g. {first[:12]}")
print(f"after '4': {len(after)} tokens allowed: {after}")
_ = check("the token automaton allows the digits 1-9 at the start, then any digit or the end after '4'",
          len(first) == 9 and len(after) == 11 and tok.decode([tok.eos_id]) in after)

# %% [markdown]
# After `'4'` the grammar allows the ten digits and the end-of-sequence token, nothing else, out of 49,152: a mask
# turns "what the model would like to say" into "what it may say".
#
# ## 3 · The mask inside the compiled step
#
# Each row of the continuous engine's step carries its bitmask: `[B, ceil(V / 32)]` int32, 1,536 words for
# SmolLM2, 6 KB a row. Inside the jitted step the bits are unpacked and the forbidden logits set to −∞, before the
# choice (greedy or sampled), in `jaxlab.engine.grammar.mask_logits`:

# %%
_ = show_source(mask_logits, skip_docstring=True)

# %% [markdown]
# A free row passes every bit set, so its logits are untouched and **one compiled program** serves free and
# constrained rows side by side. The grammar's state never enters the program: the host keeps each request's
# matcher, fills its row of the mask before the step and advances it after. Two checks: a free request's tokens
# beside constrained ones equal its tokens alone, and after warm-up a mix of free and constrained requests
# compiles nothing.

# %% tags=["nbval-ignore-output"]
engine.warmup()  # every program greedy requests can need (section 1 compiled most of them)
with CompileCounter() as cc:
    beside = [engine.add_request(p, max_new_tokens=24) for p in prompts[:4]]
    engine.add_request(prompts[4], max_new_tokens=96, constraint=Constraint.json_schema(SCHEMA))
    engine.add_request(prompts[5], max_new_tokens=12, constraint=Constraint.regex("[1-9][0-9]?"))
    engine.add_request(prompts[6], max_new_tokens=8, constraint=Constraint.choice(["yes", "no"]))
    engine.run()
alone = engine.generate(prompts[:4], 24)
mixed_compiles = cc.count

# %%
check("free requests beside constrained ones get the tokens they get alone",
      [s.token_ids for s in beside] == [r.generated_ids for r in alone])
check("a warmed-up engine compiles nothing for a mix of free, schema, regex and choice requests", mixed_compiles == 0)
_ = verdict("functional_style_complicates_serving", mixed_compiles,
            because="the grammar's state stays on the host; the step takes its mask as one more array argument")

# %% [markdown]
# ## 4 · The base model, constrained
#
# The same eight items with the schema. **Predict first:** the mask guarantees the *form*; will the *content*
# (the fields exactly right) get better, worse, or stay the same?

# %% tags=["nbval-ignore-output"]
schema = Constraint.json_schema(SCHEMA)
constrained = engine.generate(prompts, 96, constraint=schema)
for r in constrained[:3]:
    print(repr(r.text))
con_valid = sum(schema_valid(r.text) for r in constrained) / len(constrained)
con_fields = sum(fields_exact(r.text, e["answer"]) for r, e in zip(constrained, items)) / len(items)
_ = table(
        [
            {"decoding": "free", "schema-valid": f"{free_valid:.0%}", "fields right": f"{free_fields:.0%}",
             "new tokens": sum(len(r.generated_ids) for r in free)},
            {"decoding": "with the schema", "schema-valid": f"{con_valid:.0%}", "fields right": f"{con_fields:.0%}",
             "new tokens": sum(len(r.generated_ids) for r in constrained)},
        ]
)

# %%
check("every constrained reply ended by the grammar (not by the token limit)",
      all(r.finish_reason == "eos" for r in constrained))
_ = verdict("grammar_makes_output_valid", con_valid)

# %% [markdown]
# Here is what the mask did for one reply: at each step, how many tokens the grammar allowed. Inside a string
# (a name, a city) almost the whole vocabulary; at a key or a closing brace, one token (red): the model's choice
# there is the grammar's, and the model spends no probability on it.

# %% tags=["nbval-ignore-output"]
steps = structured.walk(schema, tok, V, constrained[0].generated_ids[:-1])  # without the end-of-sequence token
fig = structured.plot_allowed(steps, V, f"the schema's mask for item 0's reply ({len(steps)} tokens)")
plt.show()

# %% [markdown]
# Whitespace is the one freedom JSON gives that a model can abuse: JSON allows any run of it between elements, and
# a weak model will fill its whole token budget with tabs. `jaxlab.engine.grammar.WHITESPACE` bounds it (at most 12
# spaces or newlines at each separator) unless a schema asks otherwise through llguidance's `"x-guidance"` options.
#
# ## 5 · What the mask costs
#
# Two costs: the host computes each constrained row's mask between steps (llguidance, about a tenth of a
# millisecond a row here), and the device unpacks and applies it inside the step. `jaxlab.bench.structured.step_cost`
# times the decode step with every row free and with every row under the schema, in one engine, over the steps
# where every row decodes: three rounds, each kind's best median (one round on this shared 2-core machine ranged
# from 1.00x to 1.37x over four runs; the best of three stayed within a few percent). **Predict first:** at batch
# 8, what fraction of a step is the mask?

# %% tags=["nbval-ignore-output"]
cost = step_cost(m.params, tok, items, 8, lambda _: None, new_tokens=40, reps=3)
print(f"batch 8: free {cost['free']['step_s'] * 1e3:.1f} ms/step, with the schema {cost['schema']['step_s'] * 1e3:.1f} "
      f"ms/step ({cost['ratio']:.2f}x); the host's grammar work {cost['schema']['grammar_s'] * 1e3:.2f} ms a step "
      f"({cost['grammar_share']:.1%} of it)")
_ = verdict("grammar_mask_costs_little", {"batch 8, measured now": cost["ratio"]})

# %% [markdown]
# The host's share is small because a mask is computed from the grammar's state alone, a few hundred bytes of
# work per row, while the step reads every weight. It grows with the rows (one mask per constrained row), which
# is why engines compute masks in parallel threads (`llguidance`'s executor) and overlap them with the device
# step; on this CPU the step dwarfs it. The number of steps matters as much as their price: the grammar ends a
# reply as soon as its object closes (no trailing prose), and section 4's table shows the tokens each way spent.
#
# ## 6 · All 250 test items, and a fine-tuned adapter beside them
#
# `jaxlab bench --structured --adapter DIR` runs the whole test split, the base model and notebook 15's LoRA
# adapter each without and with the schema, and the step cost at batch 1 and 32. Its stored run:

# %% tags=["nbval-ignore-output"]
run = stored("structured-cpu")
print(run["label"])
fig = structured.plot_quality(run["rows"], f"{len(run['rows'])} settings on {run['items']} test items ({run['label']})")
plt.show()
table([{"weights": r["weights"], "schema": "yes" if r["schema"] else "no", "schema-valid": f"{r['schema_valid']:.1%}",
        "match": f"{r['match']:.1%}", "fields right": f"{r['field_exact']:.1%}"} for r in run["rows"]])
table([{"batch": c["batch"], "free ms/step": c["free"]["step_s"] * 1e3, "schema ms/step": c["schema"]["step_s"] * 1e3,
        "ratio": round(c["ratio"], 3)} for c in run["cost"]])
_ = verdict("grammar_mask_costs_little", {f"batch {c['batch']}": c["ratio"] for c in run["cost"]}, source=run["label"])


# %% [markdown]
# The mask makes every reply valid; it does not make the fields right. The base model still copies the wrong city
# or capitalises a job ("Teacher" for "teacher"): the grammar constrains the form, the weights decide the
# content. The adapter learnt both; with the schema on top it keeps its content and cannot break the form, the
# pairing a production system would ship.
#
# ## Summary
#
# - A grammar (JSON schema, regex, choices) becomes, at each step, the set of tokens whose bytes keep the text
#   inside it; tokens that span boundaries (`'",'`) are why this is walked over bytes, not whole tokens.
# - The set travels as a bitmask `[B, ceil(V/32)]` int32 into the jitted step, which sets forbidden logits to −∞
#   before choosing; free rows pass all ones, so one compiled program serves both and nothing recompiles.
# - The grammar's state lives on the host, one matcher per request, advanced between steps: the "stateful serving"
#   the functional style is said to complicate is a host object and one more array argument.
# - The base model's replies become schema-valid without training; the content (fields right) is the weights'
#   job, which a fine-tuned adapter does better.
# - The cost per step is the host's mask work plus an unpack on the device: a few percent at most here.
#
# **Quiz**
#
# 1. Why can't a grammar engine decide a token's legality by looking at its text as one unit of the grammar?
#    <details><summary>Answer</summary>BPE tokens do not respect grammar boundaries: `'",'` closes a string and
#    starts the next element, `'42'` is two digits, `' "'` is whitespace and a quote. The engine must walk each
#    token's bytes through the automaton, from the current state.</details>
# 2. A free row beside a constrained one: why are its tokens unchanged, and why is no program compiled?
#    <details><summary>Answer</summary>Its mask is all ones, so its logits are untouched (the `where` keeps every
#    value), and every row always passes a mask of the same shape: the program's signature never changes.
#    </details>
# 3. With the schema, the base model's replies were all valid, yet fewer than all fields were right. What would
#    you change to improve the fields, and what would you keep?
#    <details><summary>Answer</summary>The weights: fine-tune (notebook 15) or use a stronger model, or give
#    examples in the prompt. Keep the grammar: it guarantees the form whatever the weights do.</details>
#
# ## Exercises
#
# Solutions are in `notebooks/solutions/17_structured_output.py`.
#
# **1. Unpack a mask.** `my_unpack(row, vocab)`: a bitmask row of `ceil(vocab / 32)` int32 words -> a bool array
# of `vocab` entries, bit `i` of word `w` being token `32 * w + i` (NumPy is enough; mind the sign bit).

# %%
def my_unpack(row, vocab):
    raise NotImplementedError


from jaxlab.lab.exercises import nb17

passed = nb17.check_unpack(my_unpack)


# %% [markdown]
# **2. Mask the logits.** `my_mask_logits(logits, allowed)`: logits `[V]` float32 and allowed `[V]` bool -> the
# logits with every forbidden token at −∞.

# %%
def my_mask_logits(logits, allowed):
    raise NotImplementedError


passed = nb17.check_mask_logits(my_mask_logits)


# %% [markdown]
# **3. A regex for a list of choices.** `my_choice_regex(options)`: a regex that matches exactly one of the
# options, whole. Some options hold characters a regex reads as operators (`"a.b"`, `"c+"`, `"(x)"`).

# %%
def my_choice_regex(options):
    raise NotImplementedError


passed = nb17.check_choice_regex(my_choice_regex)

# %% [markdown]
# **An experiment of your own.** `jaxlab generate --regex "(19|20)[0-9]{2}" "When did the Berlin Wall fall?"`: the
# model must answer with a year. Does it pick the right one? Then try `--choice` with options that reorder the
# same words, and `jaxlab serve` with the `openai` client's `client.chat.completions.parse(response_format=...)`
# and a pydantic model of your own.
