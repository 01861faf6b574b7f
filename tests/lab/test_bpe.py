"""jaxlab.lab.bpe (the teaching BPE) and the checkers of notebook 02's exercises.

The trainer is checked on the classic "aaabdaaabac" example, for determinism, round trips on arbitrary
text and shrinking encodings as the vocabulary grows; the encoder, loaded with SmolLM2's merges, must
give the Rust tokenizer's ids on ordinary text. Each exercise checker must FAIL on wrong answers and
PASS on the solutions in notebooks/solutions/02_tokenization.py.
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import load_solution
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jaxlab.lab import bpe
from jaxlab.lab.exercises import nb02

HYPOTHESIS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])

CORPUS = (
    "The quick brown fox jumps over the lazy dog. The dog sleeps; the fox runs on.\n"
    "Tokenizers cut text into tokens, and the tokens become ids. It's 2024 and we're learning BPE!\n"
    "def tokenize(text):\n    return text.split()\n"
) * 3


@pytest.fixture(scope="module")
def trained():
    return bpe.train(CORPUS, 320)


def test_classic_example():
    # Wikipedia's example: aa -> Z, then ab -> Y (tied with Za, smaller ids win), then ZY -> X.
    tok = bpe.train("aaabdaaabac", 300)
    assert list(tok.merges.items()) == [((97, 97), 256), ((97, 98), 257), ((256, 257), 258)]
    assert tok.counts == [4, 2, 2]
    assert tok.encode("aaabdaaabac") == [258, ord("d"), 258, ord("a"), ord("c")]
    assert [tok.token_str(i) for i in (256, 257, 258)] == ["aa", "ab", "aaab"]
    assert tok.vocab_size == 259  # stopped early: no pair left to merge


def test_pretokenize_covers_text_and_keeps_spaces_with_words():
    text = "Hello world, it's 2024!\n\n  def f(x_1):  return  x"
    pieces = bpe.pretokenize(text)
    assert "".join(pieces) == text
    assert pieces[:5] == ["Hello", " world", ",", " it", "'s"]
    digits = bpe.pretokenize("year 2024", bpe.DIGITS_PATTERN)
    assert digits == ["year", " ", "2", "0", "2", "4"]


@HYPOTHESIS
@given(st.text(max_size=80))
def test_pretokenize_never_loses_text(text):
    assert "".join(bpe.pretokenize(text)) == text
    assert "".join(bpe.pretokenize(text, bpe.DIGITS_PATTERN)) == text


@HYPOTHESIS
@given(st.text(max_size=200))
def test_roundtrip_on_arbitrary_text(trained, text):
    # st.text() draws valid unicode (no lone surrogates): every character has UTF-8 bytes.
    assert trained.decode(trained.encode(text)) == text


@HYPOTHESIS
@given(st.text(min_size=1, max_size=60))
def test_training_on_any_text_roundtrips(text):
    tok = bpe.train(text, 270)
    assert tok.decode(tok.encode(text)) == text
    assert len(tok.encode(text)) <= len(text.encode("utf-8"))


def test_merges_are_deterministic(trained):
    again = bpe.train(CORPUS, 320)
    assert list(again.merges.items()) == list(trained.merges.items())
    assert again.counts == trained.counts
    # Counts never increase: a merge only removes pairs, or makes pairs with the new token, which
    # occurs exactly as often as the pair it replaced.
    assert all(a >= b for a, b in zip(trained.counts, trained.counts[1:]))


def test_smaller_vocab_is_a_prefix(trained):
    small = bpe.train(CORPUS, 280)
    assert list(small.merges.items()) == list(trained.merges.items())[:24]


def test_encoding_shrinks_as_vocab_grows():
    held_out = "The lazy fox tokenizes the quick dog's text."
    sizes = [256, 260, 280, 320, 400]
    lengths = [len(bpe.train(CORPUS, v).encode(CORPUS)) for v in sizes]
    assert lengths[0] == len(CORPUS.encode("utf-8"))
    assert all(a > b for a, b in zip(lengths, lengths[1:]))
    held = [len(bpe.train(CORPUS, v).encode(held_out)) for v in sizes]
    assert all(a >= b for a, b in zip(held, held[1:])) and held[-1] < held[0]


def test_training_equals_encoding(trained):
    # Replaying the merges lowest rank first reproduces training's segmentation of the corpus.
    words = [list(w.encode()) for w in bpe.pretokenize(CORPUS)]
    for pair, new in trained.merges.items():
        words = [bpe.merge(w, pair, new) for w in words]
    assert [i for w in words for i in w] == trained.encode(CORPUS)


def test_helpers():
    assert bpe.count_pairs([1, 1, 1, 2]) == {(1, 1): 2, (1, 2): 1}
    assert bpe.count_pairs([]) == {} and bpe.count_pairs([5]) == {}
    assert bpe.merge([1, 1, 1], (1, 1), 9) == [9, 1]
    assert bpe.merge([1, 2, 1, 2, 3], (1, 2), 9) == [9, 9, 3]
    with pytest.raises(ValueError, match="at least 256"):
        bpe.train("abc", 100)


def test_readable_tokens_and_merge_rows(trained):
    assert trained.tokens(" the\n") == ["Ġthe", "Ċ"]
    rows = trained.merge_rows(3)
    assert [r["rank"] for r in rows] == [0, 1, 2]
    assert rows[0]["new token"] == rows[0]["left"] + rows[0]["right"]
    assert rows[0]["count"] == trained.counts[0]


def test_decode_of_half_a_character_is_replacement(trained):
    ids = trained.encode("é")  # two bytes, 0xC3 0xA9: not merged in this tiny vocabulary
    assert len(ids) == 2 and trained.decode(ids[:1]) == "\ufffd"


# ---- the real vocabulary in the teaching encoder ------------------------------------------------------


@pytest.fixture(scope="module")
def smol(gguf_path):
    return bpe.BPE.from_gguf(gguf_path)


@pytest.fixture(scope="module")
def rust(gguf_path):
    from jaxlab.io.tokenizer import Tokenizer

    return Tokenizer.from_gguf(gguf_path)


def test_smollm2_merges_give_the_rust_ids(smol, rust):
    texts = [
        "Hello world!",
        "def add(a, b):\n    return a + b",
        "The year 2024 cost $1,234.56",
        "café naïve Ångström",
        "日本語のテキスト",
        "I love 🦀 and 🎉",
        "hello  \n\n world",
        "  42\n\n7 x",
    ]
    for t in texts:
        assert smol.encode(t) == rust.encode(t), t
        assert smol.decode(smol.encode(t)) == t
    assert smol.vocab_size == rust.vocab_size and len(smol.merges) == 48900


@HYPOTHESIS
@given(st.text(alphabet="abcXYZ019 \n\t.,!?'_-éü日本🦀", max_size=40))
def test_smollm2_parity_on_random_ordinary_text(smol, rust, text):
    # Letters, decimal digits, punctuation, whitespace, accents, CJK, emoji: the stdlib regex agrees with
    # \p{L}/\p{N} on these (not on numbers like '½' or '²', which it treats as letters).
    assert smol.encode(text) == rust.encode(text)


def test_from_gguf_rejects_other_files(tmp_path):
    from jaxlab.errors import ModelFileError

    bad = tmp_path / "x.gguf"
    bad.write_bytes(b"nope")
    with pytest.raises(ModelFileError):
        bpe.BPE.from_gguf(bad)


# ---- the exercise checkers ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def solutions():
    return load_solution("02_tokenization")


def test_checkers_pass_the_solutions(solutions, capsys):
    assert nb02.check_count_pairs(solutions.count_pairs)
    assert nb02.check_merge(solutions.merge)
    assert nb02.check_left_pad(solutions.left_pad)
    out = capsys.readouterr().out
    assert out.count("PASS") == 3 and "FAIL" not in out


def test_checkers_report_not_implemented(capsys):
    def stub(*args):
        raise NotImplementedError

    assert not nb02.check_count_pairs(stub)
    assert not nb02.check_merge(stub)
    assert not nb02.check_left_pad(stub)
    out = capsys.readouterr().out
    assert out.count("not implemented yet") == 3


def test_count_pairs_checker_fails_wrong_answers(capsys):
    def no_overlap(ids):  # counts (a, a) in [a, a, a] once
        counts, i = {}, 0
        while i + 1 < len(ids):
            counts[(ids[i], ids[i + 1])] = counts.get((ids[i], ids[i + 1]), 0) + 1
            i += 2 if ids[i] == ids[i + 1] else 1
        return counts

    assert not nb02.check_count_pairs(no_overlap)
    assert "FAIL: count_pairs: ids=[1, 1, 1]: pair (1, 1) counted 1 time(s), expected 2" in capsys.readouterr().out
    assert not nb02.check_count_pairs(lambda ids: list(zip(ids, ids[1:])))
    assert "expected a dict" in capsys.readouterr().out


def test_merge_checker_fails_wrong_answers(solutions, capsys):
    def right_to_left(ids, pair, new_id):
        return solutions.merge(ids[::-1], pair[::-1], new_id)[::-1]

    def first_only(ids, pair, new_id):
        for i in range(len(ids) - 1):
            if (ids[i], ids[i + 1]) == tuple(pair):
                return ids[:i] + [new_id] + ids[i + 2 :]
        return ids

    for wrong in (right_to_left, first_only):
        assert not nb02.check_merge(wrong)
        assert "FAIL: merge: trial" in capsys.readouterr().out


def test_left_pad_checker_fails_wrong_answers(solutions, capsys):
    def right_pad(batch, pad_id):
        ids, mask = solutions.left_pad([s[::-1] for s in batch], pad_id)
        return ids[:, ::-1], mask[:, ::-1]

    def mask_inverted(batch, pad_id):
        ids, mask = solutions.left_pad(batch, pad_id)
        return ids, ~mask

    for wrong in (right_pad, mask_inverted):
        assert not nb02.check_left_pad(wrong)
        assert "FAIL: left_pad: trial" in capsys.readouterr().out
    assert not nb02.check_left_pad(lambda batch, pad_id: np.zeros((1, 1)))
    assert "FAIL: left_pad" in capsys.readouterr().out


def test_compare_speed_rows(trained):
    rows = bpe.compare_speed(
        {"a": trained.encode_batch, "b": lambda ts: [trained.encode(t) for t in ts]},
        {"two texts": ["the fox", "the dog"]},
        repeats=2,
    )
    (row,) = rows
    assert row["workload"] == "two texts" and row["tokens"] == sum(
        len(trained.encode(t)) for t in ("the fox", "the dog")
    )
    assert set(row) == {"workload", "tokens", "a ms", "b ms", "b speed-up", "same ids"}
    assert row["same ids"] == "yes" and row["a ms"] > 0


def test_figures_have_titles_and_labels(trained):
    import matplotlib

    matplotlib.use("Agg")
    rows = [{"vocab": v, "corpus tokens": 100 - v // 10, "held-out tokens": 50 - v // 20} for v in (256, 300)]
    figs = [
        bpe.plot_compression(rows, 120, 60),
        bpe.plot_bytes_per_token({"English": "Hello world", "digits": "2024"}, trained.encode),
        bpe.plot_throughput({"model prefill": 800.0, "pure Python": 2e5}),
    ]
    for fig in figs:
        ax = fig.axes[0]
        assert ax.get_title() and ax.get_xlabel() and ax.get_ylabel()
