"""The `jaxlab` command: answers, JSON output, and one clear stderr line for every bad input.

Most tests call ``main`` in this process (the session's model, loaded once: ``load_once``); a few run the command
in a subprocess, for what only a real process shows: the answer from the shell, arguments that are not UTF-8,
8 simulated devices, and that an error leaves one line on the process's stderr.

The answers of the whole model are checked once per way in (the shell, chat, a mesh's EOS); the tests of flags and
their combinations (quantized weights, stop strings, speculative decoding) run on its first two layers
(``small_gguf``: real weights and tokenizer, a fraction of the compile time), where what is checked is the wiring:
fields, lengths, seeds, and that two ways of decoding give the same tokens. What quantization does to the whole
model's answers is checked in tests/quant and notebook 09."""

from __future__ import annotations

import contextlib
import io
import json
import os
import random
import re
import subprocess
import sys

import pytest
from conftest import one_clean_line, run_main

from jaxlab.cli import main
from jaxlab.quant import COMPUTES_IN

pytestmark = pytest.mark.usefixtures("load_once")


def run_cli(*args, **kw):
    """Run `jaxlab` in a subprocess: (exit code, stdout, stderr)."""
    env = dict(os.environ, **kw.pop("env", {}))
    p = subprocess.run([sys.executable, "-m", "jaxlab.cli", *args], capture_output=True, env=env, timeout=300, **kw)
    return p.returncode, p.stdout.decode("utf-8", "replace"), p.stderr.decode("utf-8", "replace")


def test_generate_paris(gguf_path):
    code, out, err = run_cli("generate", "What is the capital of France?")
    assert code == 0, err
    assert "Paris" in out


def test_generate_json_batch(small, smollm, capsys):
    args = ["generate", "--model", small, "--json", "--max-new-tokens", "6", "--ignore-eos"]
    assert main([*args, "Hi", "Name a color."]) == 0
    rows = [json.loads(ln) for ln in capsys.readouterr().out.splitlines()]
    assert [r["prompt"] for r in rows] == ["Hi", "Name a color."]
    for r in rows:
        for key in ("prompt_ids", "generated_ids", "text", "prefill_seconds", "decode_seconds", "compile_seconds"):
            assert key in r
        assert len(r["generated_ids"]) == 6
        assert r["text"] == smollm.tokenizer.decode(r["generated_ids"])
        assert r["prompt_ids"] == smollm.tokenizer.apply_chat_template(
            [{"role": "user", "content": r["prompt"]}], add_generation_prompt=True, tokenize=True
        )


def test_generate_raw_and_stop(small, capsys):
    args = ["generate", "--model", small, "--raw", "--json", "--max-new-tokens", "20", "--stop", ","]
    assert main([*args, "One, two, three,"]) == 0
    row = json.loads(capsys.readouterr().out)
    assert row["prompt_ids"][0] != 1  # no chat template: no <|im_start|>
    assert "," not in row["text"]


def test_structured_output_flags(small, capsys, tmp_path):
    """--choice, --regex and --json-schema constrain what the small model (two layers, prose unaided) writes; a
    regex the grammar compiler refuses is one line."""
    args = ["generate", "--model", small, "--json", "--max-new-tokens", "40"]
    assert main([*args, "--choice", "yes,no", "Is the sky blue?"]) == 0
    assert json.loads(capsys.readouterr().out)["text"] in ("yes", "no")
    assert main([*args, "--regex", r"[A-Z][a-z]{2,6} [0-9]{2}", "Name a day."]) == 0
    assert re.fullmatch(r"[A-Z][a-z]{2,6} [0-9]{2}", json.loads(capsys.readouterr().out)["text"])
    schema = tmp_path / "s.json"
    compact = {"whitespace_flexible": False}  # the two-layer model would spend its tokens on whitespace
    ok = {
        "type": "object",
        "properties": {"ok": {"type": "boolean"}},
        "required": ["ok"],
        "additionalProperties": False,
    }
    schema.write_text(json.dumps(dict(ok, **{"x-guidance": compact})))
    assert main([*args, "--max-new-tokens", "60", "--json-schema", str(schema), "Are you ok?"]) == 0
    row = json.loads(capsys.readouterr().out)
    assert row["finish_reason"] == "eos" and isinstance(json.loads(row["text"])["ok"], bool), row["text"]
    code, _, err = run_main(capsys, [*args, "--regex", "a(b", "hi"])
    assert code != 0 and "regex cannot be used" in one_clean_line(err)


def test_sampling_seeded(small, capsys):
    args = ["generate", "--model", small, "--json", "--max-new-tokens", "12", "--temperature", "1.0"]
    args += ["--top-p", "0.9", "--ignore-eos"]
    texts = []
    for seed in ("1", "1", "2"):
        assert main(args + ["--seed", seed, "Tell me a story."]) == 0
        texts.append(json.loads(capsys.readouterr().out)["generated_ids"])
    assert texts[0] == texts[1] != texts[2]


@pytest.mark.parametrize(
    "args, match",
    [
        (["generate", "--max-new-tokens", "-5", "hi"], "max-new-tokens"),
        (["generate", "--temperature", "-1", "hi"], "temperature"),
        (["generate", "--top-p", "1.5", "hi"], "top_p"),
        (["generate", "--top-p", "0", "hi"], "top_p"),
        (["generate", "--dtype", "float8", "hi"], "dtype"),
        (["generate", "--max-new-tokens", "ten", "hi"], "invalid int"),
        (["generate", "--model", "/nonexistent/model.gguf", "hi"], "not found"),
        (["generate"], "required"),
        (["frobnicate"], "invalid choice"),
        (["generate", "--attention", "triton", "hi"], "invalid choice"),
        (["generate", "--attention", "pallas", "--kv-cache", "int8", "hi"], "float KV cache"),
        (["chat", "--attention", "pallas", "--kv-cache", "int8"], "float KV cache"),
        (["generate", "--regex", "[0-9]", "--choice", "a,b", "hi"], "--regex and --choice"),
        (["generate", "--json-schema", "/nonexistent/schema.json", "hi"], "cannot read"),
        (["generate", "--choice", "a,b", "--speculative", "ngram", "hi"], "drop --speculative"),
    ],
)
def test_bad_input_one_line(capsys, args, match):
    code, _, err = run_main(capsys, args)
    assert code != 0
    assert match in one_clean_line(err)


def test_serve_on_a_busy_port_says_so_before_loading_the_model(capsys):
    import socket

    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        # a model that does not exist: the port is checked first, so its error is the one the user sees
        code, _, err = run_main(capsys, ["serve", "--port", str(port), "--model", "/nonexistent/model.gguf"])
    assert code == 1
    assert f"port {port} on 127.0.0.1 is in use" in one_clean_line(err) and f"--port {port + 1}" in err


def test_serve_no_overlap_turns_the_engines_look_ahead_off():
    from jaxlab.cli import build_parser

    assert build_parser().parse_args(["serve"]).overlap is True
    assert build_parser().parse_args(["serve", "--no-overlap"]).overlap is False


@pytest.mark.parametrize(
    "args, code, match",
    [
        (["frobnicate"], 2, "invalid choice"),  # argparse's error
        (["generate", "--mesh", "data=2,model=4", "hi"], 1, "xla_force_host_platform_device_count"),  # ours
    ],
)
def test_errors_leave_one_line_on_the_process_stderr(args, code, match):
    """What the user sees from the shell: the exit code and one line, nothing else (no warning, no traceback)."""
    got, _, err = run_cli(*args)
    assert got == code
    assert match in one_clean_line(err)


@pytest.mark.parametrize(
    "content, match",
    [
        (b"", "empty"),
        (b"hello, I am a text file\n" * 10, "not a GGUF"),
        (b"GGUF" + random.Random(0).randbytes(64), "corrupt"),  # seeded: the same file, and test id, every run
    ],
    ids=["empty", "text", "gguf-magic-then-noise"],
)
def test_bad_model_files(tmp_path, capsys, content, match):
    f = tmp_path / "model.gguf"
    f.write_bytes(content)
    code, _, err = run_main(capsys, ["generate", "--model", str(f), "hi"])
    assert code == 1
    line = one_clean_line(err)
    assert match in line and str(f) in line


def test_truncated_model_file(tmp_path, gguf_path, capsys):
    f = tmp_path / "cut.gguf"
    f.write_bytes(gguf_path.read_bytes()[:40_000_000])
    code, _, err = run_main(capsys, ["generate", "--model", str(f), "hi"])
    assert code == 1
    assert "truncated" in one_clean_line(err)


def test_prompt_too_long(gguf_path, capsys):
    code, _, err = run_main(capsys, ["generate", "--raw", "--max-new-tokens", "100", "word " * 9000])
    assert code == 1
    line = one_clean_line(err)
    assert "context is 8192" in line and "shorten the prompt" in line


@pytest.mark.parametrize("prompt", ["", "\x00\x07bell\x1b[31m", "tab\tand\nnewline"])
def test_odd_text_is_handled(prompt, small, capsys):
    assert main(["generate", "--model", small, "--json", "--max-new-tokens", "3", "--ignore-eos", prompt]) == 0
    row = json.loads(capsys.readouterr().out)
    assert len(row["generated_ids"]) == 3


def test_empty_raw_prompt_starts_from_bos(small, capsys):
    assert main(["generate", "--model", small, "--raw", "--json", "--max-new-tokens", "3", "--ignore-eos", ""]) == 0
    assert json.loads(capsys.readouterr().out)["prompt_ids"] == [1]


def test_invalid_utf8_from_the_shell(small):
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "jaxlab.cli",
            "generate",
            "--model",
            small,
            "--json",
            "--max-new-tokens",
            "3",
            "--ignore-eos",
            b"caf\xe9 \xff".decode("utf-8", "surrogateescape"),
        ],
        capture_output=True,
        timeout=300,
    )
    assert p.returncode == 0, p.stderr.decode()
    row = json.loads(p.stdout)
    assert "\ufffd" in row["prompt"]


def test_chat_streams_and_keeps_history(gguf_path, capsys, monkeypatch):
    monkeypatch.setattr(sys, "stdin", io.StringIO("What is the capital of France?\nAnd of Italy?\n/exit\n"))
    code, out, err = run_main(capsys, ["chat", "--max-new-tokens", "24"])
    assert code == 0, err
    assert "Paris" in out and "Rome" in out


def test_info(capsys):
    assert main(["info", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["backend"] == "cpu" and d["versions"]["jax"]
    assert d["matmul_precision"]["float32"] == "highest"
    assert d["device_kind"] == "cpu" and d["chip"] is None
    assert d["peaks"] == "CPU: no published peak; see `jaxlab bench` for measured ceilings"
    assert (d["numerics"]["dtype"], d["numerics"]["precision"]) == ("float32", "highest")
    from jaxlab.engine import hugepages
    from jaxlab.engine.kernels import cpu as cpu_kernels

    assert d["cpu_kernels"] == cpu_kernels.status().reason
    assert d["huge_pages"] == hugepages.status().reason


def test_info_prints_the_chip_and_its_peaks(capsys, monkeypatch):
    from jaxlab.engine.model import backend_numerics
    from jaxlab.tools import about, hardware

    assert main(["info"]) == 0
    out = capsys.readouterr().out
    assert "chip          cpu" in out and "peaks         CPU: no published peak" in out
    assert "CPU kernels   " in out and "huge pages    " in out
    # on an accelerator: the chip's published peaks (faked device kind), in --json and in the text
    d = about.info()
    chip = hardware.CHIPS["TPU v5e"]
    d.update(
        device_kind="TPU v5 lite",
        chip={"name": chip.name},
        peaks=hardware.describe_peaks(chip),
        fallback=hardware.fallback_note("cpu", "tpu", {}),
    )
    d["numerics"] = backend_numerics("tpu")
    text = about.format_info(d)
    assert "chip          TPU v5 lite" in text and "197 TFLOP/s bfloat16" in text
    assert "default dtype bfloat16, matmul precision default (TPU: bfloat16" in text
    assert "NOTE" in text and "CPU figures" in text


def test_mesh_matches_single_device(small, capsys):
    """`jaxlab generate --mesh data=2,model=4` on the tests' 8 simulated CPU devices gives the single-device tokens."""
    single = plain_small(small)["generated_ids"]
    assert generate_json(capsys, *small_args(small), "--mesh", "data=2,model=4")["generated_ids"] == single


def test_mesh_is_greedy_only(capsys):
    code, _, err = run_main(capsys, ["generate", "--mesh", "data=1,model=1", "--temperature", "0.7", "hi"])
    assert code == 1
    assert "greedily" in one_clean_line(err)


@pytest.mark.parametrize("method", ["ngram", "draft"])
def test_speculative_gives_plain_greedy_tokens(small, capsys, method):
    plain = plain_small(small)["generated_ids"]
    spec = generate_json(capsys, *small_args(small), "--speculative", method, "--draft-k", "3", "--draft-layers", "1")
    assert spec["generated_ids"] == plain


def test_speculative_honours_stop_strings_like_plain(small, capsys):
    """--stop with --speculative cuts the reply where plain generation cuts it (both loops share TextStops). On the
    first two layers: the stop string is a word of the shared plain run's reply (``plain_small``), past its start,
    so both loops must cut the same reply at the same place; their programs are the ones the plain and speculative
    runs above compiled."""
    text = plain_small(small)["text"]
    stop = next(" " + w for w in text.split()[1:] if text.find(" " + w) > 0)
    cut = text.find(stop)
    plain = generate_json(capsys, *small_args(small, "--stop", stop))
    assert (plain["text"], plain["finish_reason"]) == (text[:cut], "stop")
    spec = generate_json(capsys, *small_args(small, "--stop", stop), "--speculative", "ngram", "--draft-k", "3")
    assert (spec["text"], spec["finish_reason"]) == (text[:cut], "stop")


def test_mesh_reports_eos_like_the_generator(gguf_path, capsys):
    """On a mesh, a reply that ends in EOS is cut before it and reported as finish_reason "eos"."""
    args = ["--max-new-tokens", "32", "What is the capital of France?"]
    single = generate_json(capsys, *args)
    assert single["finish_reason"] == "eos"
    sharded = generate_json(capsys, *args, "--mesh", "data=1,model=1")
    assert (sharded["generated_ids"], sharded["finish_reason"]) == (single["generated_ids"], "eos")


# --------------------------------------------------------------------------------------------------
# Quantization: --quant, --group-size, --kv-cache
# --------------------------------------------------------------------------------------------------

FRANCE = "What is the capital of France?"


@pytest.fixture(scope="module")
def quant_cache_dir(converted_cache):
    return converted_cache


@pytest.fixture
def quant_env(quant_cache_dir, monkeypatch):
    """The environment of a quantized run, set for this process too (for `main`)."""
    from jaxlab.tools import compile_cache

    env = {
        "JAXLAB_CACHE": str(quant_cache_dir),
        "JAXLAB_COMPILE_CACHE": str(compile_cache.default_dir()),
    }  # compiled programs: the usual folder
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    return env


def generate_json(capsys, *args):
    assert main(["generate", "--json", *args]) == 0
    return json.loads(capsys.readouterr().out)


#: The prompt of the plain greedy run on the first two layers that several tests compare with (speculative
#: decoding, a mesh, quantized weights): repetitive, so the n-gram drafter has something to copy.
REPEAT = "Repeat exactly: the quick brown fox jumps over the lazy dog. the quick brown fox"
_PLAIN: dict = {}


def small_args(small, *extra):
    """The arguments of the shared run on the first two layers: 16 tokens of ``REPEAT``, EOS ignored."""
    return ["--model", small, *extra, "--max-new-tokens", "16", "--ignore-eos", REPEAT]


def plain_small(small, *extra) -> dict:
    """``jaxlab generate --json`` with :func:`small_args` (``extra``: more flags, ``--quant int8``), run once
    per module and shared by the tests that compare another way of decoding with it."""
    key = (small, *extra)
    if key not in _PLAIN:
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            assert main(["generate", "--json", *small_args(small, *extra)]) == 0
        _PLAIN[key] = json.loads(out.getvalue())
    return _PLAIN[key]


def test_generate_quant_int8_decodes_with_the_quantized_weights(quant_env, small, small_model):
    """``--quant int8`` decodes with ``jaxlab.quant``'s int8 weights: the shared int8 run's tokens on the first two
    layers are an engine's on ``quant.quantize_params`` of the same model, and not the float model's (on this
    prompt they part at the sixth token). What int8 does to the whole model's answers:
    tests/quant/test_quant.py::test_int8_keeps_the_embedded_models_next_token and notebook 09 (top-1 agreement)."""
    from jaxlab import quant
    from jaxlab.engine.generate import Generator

    row = plain_small(small, "--quant", "int8")
    engine = Generator(quant.quantize_params(small_model.params, "int8"), small_model.tokenizer)
    (want,) = engine.generate([row["prompt_ids"]], 16, ignore_eos=True)
    assert row["generated_ids"] == want.generated_ids != plain_small(small)["generated_ids"]


def test_quant_json_fields(quant_env, small, capsys):
    """Each format's fields, on the first two layers (what each format does to the whole model's answers:
    tests/quant/test_quant.py, test_quality.py and notebook 09). The plain and int8 runs are the ones the
    speculative tests compare with (``plain_small``)."""
    plain = plain_small(small)
    assert (plain["quant"], plain["kv_cache"], plain["computes_in"]) == (None, "float32", "float32 activations")
    for fmt, extra in (("int8", []), ("int4", ["--group-size", "32"]), ("w8a8", [])):
        row = (
            plain_small(small, "--quant", "int8")
            if fmt == "int8"
            else generate_json(capsys, *small_args(small, "--quant", fmt, *extra))
        )
        assert (row["quant"], row["kv_cache"], len(row["generated_ids"])) == (fmt, "float32", 16)
        assert row["computes_in"] == COMPUTES_IN[fmt]


@pytest.mark.parametrize("quant", [[], ["--quant", "int8"]])
def test_kv_cache_int8(quant_env, small, capsys, quant):
    row = generate_json(capsys, "--model", small, *quant, "--kv-cache", "int8", "--max-new-tokens", "4", FRANCE)
    assert row["kv_cache"] == "int8" and row["quant"] == (quant[1] if quant else None)
    assert 1 <= len(row["generated_ids"]) <= 4


def test_speculative_draft_on_quantized_weights(quant_env, small, capsys):
    """The draft model is the first layers of the quantized model; the tokens are still plain greedy's."""
    plain = plain_small(small, "--quant", "int8")
    spec = generate_json(
        capsys, *small_args(small, "--quant", "int8"), "--speculative", "draft", "--draft-k", "3", "--draft-layers", "1"
    )
    assert spec["generated_ids"] == plain["generated_ids"] and spec["quant"] == "int8"


@pytest.mark.parametrize(
    "args, code, match",
    [
        (
            ["generate", "--quant", "int8", "--dtype", "bfloat16", "hi"],
            1,
            "--quant int8 computes in float32; drop --dtype bfloat16",
        ),
        (["chat", "--quant", "int4", "--dtype", "bfloat16"], 1, "drop --dtype bfloat16"),
        (
            ["generate", "--quant", "int8", "--mesh", "data=1,model=1", "hi"],
            1,
            "--mesh shards float parameters with a KV cache of their dtype; drop --quant",
        ),
        (["generate", "--kv-cache", "int8", "--mesh", "data=1,model=1", "hi"], 1, "drop --kv-cache int8"),
        (
            ["generate", "--quant", "w8a8", "--kv-cache", "int8", "--mesh", "data=1,model=1", "hi"],
            1,
            "drop --quant and --kv-cache int8",
        ),
        (
            ["generate", "--kv-cache", "int8", "--speculative", "ngram", "hi"],
            1,
            "only with a float KV cache; drop --kv-cache int8",
        ),
        (
            ["generate", "--dtype", "bfloat16", "--kv-cache", "float32", "--speculative", "ngram", "hi"],
            1,
            "drop --kv-cache float32",
        ),
        (
            ["generate", "--quant", "int8", "--group-size", "64", "hi"],
            1,
            "--group-size applies to --quant int4 only; drop --group-size",
        ),
        (["chat", "--group-size", "64"], 1, "drop --group-size"),
        (
            ["generate", "--quant", "int4", "--group-size", "7", "hi"],
            1,
            "int4 group size must be an even integer >= 2, got 7",
        ),
        (["generate", "--quant", "int3", "hi"], 2, "argument --quant: invalid choice: 'int3'"),
        (["generate", "--kv-cache", "int4", "hi"], 2, "argument --kv-cache: invalid choice: 'int4'"),
    ],
)
def test_quant_flags_that_cannot_work(quant_env, capsys, args, code, match):
    got, _, err = run_main(capsys, args)
    assert got == code
    assert match in one_clean_line(err)


def test_int4_group_size_must_divide_the_model(quant_env, small, capsys):
    """On the first two layers: the whole model's matrix shapes (576 is not a multiple of 128)."""
    code, _, err = run_main(capsys, ["generate", "--model", small, "--quant", "int4", "--group-size", "128", "hi"])
    assert code == 1
    assert "not a multiple of the int4 group size 128" in one_clean_line(err)


def test_info_lists_the_formats(capsys):
    assert main(["info"]) == 0
    assert "--quant int8, int4, w8a8" in capsys.readouterr().out
