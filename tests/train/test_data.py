"""The shipped task data, and examples -> batches (the loss on the answer only, padding that changes nothing)."""

import json

import numpy as np
import pytest

from jaxlab.errors import InvalidRequestError
from jaxlab.io.assets import data_file
from jaxlab.train import data, task


def test_shipped_splits_are_what_the_generator_writes_and_share_no_person():
    generated = task.generate()
    names = {}
    for split, examples in generated.items():
        lines = data_file("finetune", f"{split}.jsonl").read_text(encoding="utf-8").splitlines()
        assert [json.loads(line) for line in lines] == [e.to_json() for e in examples]
        names[split] = {json.loads(e.answer)["name"] for e in examples}
        assert len(names[split]) == len(examples)
    assert len(generated["test"]) >= 200
    assert not names["test"] & names["train"] and not names["validation"] & names["train"]


def test_every_answer_is_in_its_text_and_distractors_are_there():
    examples = task.generate()["train"]
    for e in examples:
        text, answer = e.prompt.split("Text: ", 1)[1], json.loads(e.answer)
        assert (
            answer["name"] in text and str(answer["age"]) in text and answer["city"] in text and answer["job"] in text
        )
    with_second_city = sum(sum(c in e.prompt.split("Text: ")[1] for c in task.CITIES) >= 2 for e in examples)
    assert with_second_city > len(examples) // 4


def test_score_is_strict_and_lenient_as_documented():
    answer = task.answer_json("Ana Silva", 34, "Lisbon", "nurse")
    assert task.score(answer, answer) == {"exact": True, "match": True}
    spaced = '```json\n{\n  "name": "Ana Silva",\n  "age": 34,\n  "city": "Lisbon",\n  "job": "nurse"\n}\n```'
    assert task.score(spaced, answer) == {"exact": False, "match": True}
    for wrong in ('{"name": "Ana Silva", "age": "34", "city": "Lisbon", "job": "nurse"}', "Ana is a nurse.", "{oops}"):
        assert task.score(wrong, answer) == {"exact": False, "match": False}


class CharTokenizer:
    """A stand-in tokenizer for the tiny model: one id per character, a two-id chat template."""

    eos_id = pad_id = 2

    def encode(self, text):
        return [3 + ord(c) % 250 for c in text]

    def apply_chat_template(self, messages, add_generation_prompt=True, tokenize=True):
        return [1] + self.encode(messages[-1]["content"]) + [4]


def test_batches_score_only_the_answer_and_end_of_turn():
    tok = CharTokenizer()
    encoded = [
        data.encode_example(tok, {"prompt": "hello", "answer": "ab"}),
        data.encode_example(tok, {"prompt": "a longer prompt", "answer": "xyz!"}),
    ]
    b = data.make_batch(encoded, tok.pad_id)
    assert b.tokens.shape == (2, 32) and b.at.shape == (2, 16)
    ids, n_prompt = encoded[1]
    assert list(b.positions[1, : len(ids)]) == list(range(len(ids))) and (b.positions[1, len(ids) :] == -1).all()
    n = len(ids) - n_prompt
    assert n == 5  # "xyz!" and end of turn
    assert list(b.targets[1, :n]) == ids[n_prompt:] and ids[-1] == tok.eos_id
    assert list(b.at[1, :n]) == list(range(n_prompt - 1, len(ids) - 1))  # each predicted from the token before
    assert list(b.weights[1]) == [1.0] * n + [0.0] * (16 - n) and b.weights[0].sum() == 3


def test_batch_stream_is_a_function_of_the_step():
    tok = CharTokenizer()
    encoded = [data.encode_example(tok, {"prompt": f"p{i}", "answer": f"a{i}"}) for i in range(10)]
    one, two = data.Batches(encoded, 4, 2, seed=5), data.Batches(encoded, 4, 2, seed=5)
    assert one.per_epoch == 2
    for s in (0, 1, 2, 7, 3):
        np.testing.assert_array_equal(one.at(s).tokens, two.at(s).tokens)
    assert not np.array_equal(one.at(0).tokens, one.at(2).tokens)  # a new epoch, a new order


def test_bad_files_and_sizes_say_what_to_do(tmp_path):
    bad = tmp_path / "bad.jsonl"
    for text, message in (
        ('{"prompt": "x"}', 'needs non-empty string fields "prompt" and "answer"'),
        ("not json", "not JSON"),
        ("\n", "no examples"),
    ):
        bad.write_text(text)
        with pytest.raises(InvalidRequestError, match=message):
            data.read_jsonl(bad)
    with pytest.raises(InvalidRequestError, match="no such file"):
        data.read_jsonl(tmp_path / "missing.jsonl")
    encoded = [data.encode_example(CharTokenizer(), {"prompt": "p", "answer": "a"})]
    with pytest.raises(InvalidRequestError, match="fewer than one batch"):
        data.Batches(encoded, 4, 2)
    with pytest.raises(InvalidRequestError, match="raise --max-len"):
        data.Batches(encoded * 4, 4, 2, max_len=3)
