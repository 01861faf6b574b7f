"""``jaxlab compile``: the lab's programs compiled by libtpu for TPUs that are not here (no chip attached).

The whole model's decode step, the continuous engine's rows step and every Pallas kernel must compile for v5e-1
and v6e-1 (a refusal fails with the compiler's message), the kernels must really be in the TPU program (Mosaic
custom calls, not the interpreted variant this CPU runs), and the tensor-parallel decode for v5e-8 must hold the
collectives the CPU simulation's program holds (tests run with 8 simulated CPU devices).
"""

from __future__ import annotations

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import one_clean_line, run_main
from jax.experimental import pallas as pl
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from jaxlab.bench import chip_compile as cc
from jaxlab.io.config import smollm2_135m, tiny
from jaxlab.tools import hardware
from jaxlab.tools import profile as prof

CONTEXT = 256  # one page-table width: the rows step's smallest program
TINY_HF = dict(  # a Hugging Face config.json of a two-layer Llama
    architectures=["LlamaForCausalLM"], model_type="llama", vocab_size=512, hidden_size=64, num_hidden_layers=2,
    num_attention_heads=4, num_key_value_heads=2, intermediate_size=128, max_position_embeddings=512,
    rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=True,
)  # fmt: skip


def _refusals(report):
    return "\n".join(f"{p.name}: {p.message}" for p in report.refused)


# v5e-1 (Colab's chip, notebook 16's) compiles the whole model; v6e-1 its first two layers at the same widths: the
# same programs and kernels, a fifteenth of the layers to compile (the whole model's fit is v5e's check)
@pytest.mark.parametrize("chip, layers", [("v5e-1", 30), ("v6e-1", 2)])
def test_decode_rows_and_every_kernel_compile_for_the_chip(chip, layers):
    model = smollm2_135m().replace(n_layers=layers)
    xla = cc.Settings(model, batch=8, context=CONTEXT)
    r = cc.compile_all(xla, chip, only=lambda n: n.startswith(("decode step", "rows decode", "kernel")))
    names = [p.name for p in r.programs]
    assert len(names) == 5 and sum(n.startswith("kernel") for n in names) == 3, names
    assert not r.refused, _refusals(r)
    decode = r.programs[0]
    # the compiler's memory figures: the bfloat16 weights and cache are the arguments, the donated cache aliased
    assert decode.argument_bytes >= r.weights_bytes + r.cache_bytes > 0
    assert decode.alias_bytes >= r.cache_bytes and decode.code_bytes > 0
    assert r.fits, r.largest
    # the prediction is a roofline bound at the chip's published peaks: at least the weights' read time
    chip_peaks = hardware.CHIPS[hardware.TOPOLOGIES[chip].chip]
    assert decode.bound == "memory" and decode.predicted_s >= r.weights_bytes / chip_peaks.hbm_bandwidth
    assert 1.0 <= decode.padding < 1.5 and decode.cost_bytes > decode.moved_bytes
    # every kernel alone is a Mosaic call; under the pallas policy the decode step holds one per layer, counted on
    # two layers: a kernel's blocks and VMEM do not depend on the layer count, the whole model's HBM fit is the XLA
    # step's check above, and the whole model's pallas step cost this test 6 of its 18 s alone
    # (docs/tests.md, seventeenth look)
    for p in r.programs[2:]:
        assert p.custom_calls.get("tpu_custom_call", 0) >= 1, (p.name, p.custom_calls)
    pallas = cc.Settings(model.replace(n_layers=2), batch=8, context=CONTEXT, attention="pallas")
    r = cc.compile_all(pallas, chip, only=lambda n: n.startswith("decode step"))
    assert not r.refused, _refusals(r)
    assert r.programs[0].custom_calls.get("tpu_custom_call") == 2


def test_tensor_parallel_decode_for_v5e_8_has_the_cpu_simulations_collectives():
    s = cc.Settings(smollm2_135m(), batch=8, context=CONTEXT)
    tpu = cc.compile_all(s, "v5e-8", only=lambda n: "tensor-parallel" in n)
    cpu = cc.compile_all(s, "cpu", only=lambda n: "tensor-parallel" in n)
    assert not tpu.refused and not cpu.refused, _refusals(tpu) + _refusals(cpu)
    (t,), (c,) = tpu.programs, cpu.programs
    assert len(cc.target("cpu").devices) == 8 and "over 8 devices" in t.name == c.name
    # two all-reduces per layer: the row-split attention output and MLP down projections' partial sums
    assert t.collectives == c.collectives == {"all-reduce": 2 * smollm2_135m().n_layers}
    # each device holds its heads' share of the weights and cache: well under the whole model
    assert t.argument_bytes < (tpu.weights_bytes + tpu.cache_bytes) / 2


def test_the_lowest_effort_compiles_the_same_flops_and_bytes_moved():
    # notebook 16 asks the compiler for its lowest optimization effort where only a bound is read (FLOPs and bytes
    # moved); the option must reach the compiler (its temporaries differ) and leave those two unchanged
    model = smollm2_135m().replace(n_layers=2)
    r = {e: cc.compile_all(cc.Settings(model, batch=8, context=CONTEXT, effort=e), "v5e-1", only=lambda n: n == "decode step [8]")
         for e in (0.0, -1.0)}  # fmt: skip
    default, fastest = (r[e].programs[0] for e in (0.0, -1.0))
    assert default.ok and fastest.ok and r[-1.0].settings.effort == -1.0
    assert (fastest.flops, fastest.moved_bytes, fastest.bound) == (default.flops, default.moved_bytes, default.bound)
    assert fastest.temp_bytes != default.temp_bytes


def test_a_block_shape_mosaic_refuses_is_reported_with_the_compilers_words():
    tgt = cc.target("v5e-1")
    one = NamedSharding(tgt.mesh(1), P())

    def copy(x_ref, o_ref):
        o_ref[...] = x_ref[...]

    def f(x):
        spec = pl.BlockSpec((3, 100), lambda i: (i, 0))
        return pl.pallas_call(copy, grid=(2,), in_specs=[spec], out_specs=spec, out_shape=x)(x)

    r = cc.compile_one("bad block", jax.jit(f), (jax.ShapeDtypeStruct((6, 300), jnp.float32, sharding=one),), None, tgt)
    assert not r.ok and "divisible by 8 and 128" in r.message and "\n" not in r.message


@pytest.mark.parametrize("fmt", ["int8", "int4", "w8a8"])
def test_quantized_shapes_are_the_quantized_models(fmt):
    from jaxlab.engine.model import init_params
    from jaxlab.quant import quantize_params, quantized_shapes

    params = init_params(tiny())
    want = quantize_params(params, fmt, 4, progress=False)
    got = quantized_shapes(jax.eval_shape(lambda: params), fmt, 4)
    assert jax.tree.structure(got) == jax.tree.structure(want)
    assert [(a.shape, a.dtype) for a in jax.tree.leaves(got)] == [(a.shape, a.dtype) for a in jax.tree.leaves(want)]


def test_the_command_writes_the_report_and_json(tmp_path, capsys):
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps(TINY_HF))
    out = tmp_path / "r.json"
    code, text, _ = run_main(
        capsys,
        [
            "compile",
            "--chip",
            "v5e-1",
            "--config",
            str(cfg),
            "--context",
            "256",
            "--only",
            "decode step",
            "--json",
            str(out),
        ],
    )
    assert code == 0, text
    assert "compiled for v5e-1" in text and "fits v5e-1" in text and "decode step [8]" in text
    res = json.loads(out.read_text())
    (row,) = res["programs"]
    assert res["fits"] and res["refused"] == 0 and row["ok"] and row["predicted_s"] > 0 and row["argument_bytes"] > 0
    assert np.isclose(res["hbm_bytes"], hardware.CHIPS["TPU v5e"].hbm_bytes)


def test_two_processes_compile_for_a_tpu_at_once(tmp_path):
    """libtpu's multi-process lockfile guards an attached TPU; two processes compiling for one that is not here (two
    test workers, a notebook beside `jaxlab compile`) must not fail each other."""
    import subprocess
    import sys

    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps(TINY_HF))
    argv = [sys.executable, "-m", "jaxlab.cli", "compile", "--chip", "v5e-1", "--config", str(cfg), "--context", "64"]
    argv += ["--only", "decode step"]
    env = {k: v for k, v in os.environ.items() if k != "ALLOW_MULTIPLE_LIBTPU_LOAD"}
    procs = [subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in "ab"]
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0 and "compiled for v5e-1" in out, err[-500:]


@pytest.mark.parametrize(
    "args, match",
    [
        (["--chip", "v5e-1", "--context", "0"], "--context must be at least 1"),
        (["--chip", "v5e-1", "--context", "999999"], "exceeds the model's"),
        (["--chip", "v5e-1", "--config", "/nonexistent/config.json"], "cannot read it as JSON"),
        (["--chip", "v5e-1", "--measure"], "use it with --chip cpu"),
        (["--chip", "v5e-1", "--effort", "2"], "--effort must lie between -1 and 1"),
    ],
)
def test_bad_flags_get_one_line(capsys, args, match):
    code, _, err = run_main(capsys, ["compile", *args])
    assert code != 0 and match in one_clean_line(err)


@pytest.mark.parametrize("name, billions", [("smollm2-1.7b", 1.71), ("llama-3-8b", 8.03)])
def test_the_shipped_public_configs_are_the_models_they_name(name, billions):
    from jaxlab.io.assets import data_file

    cfg = cc.model_config(None, str(data_file("configs", f"{name}.json")))
    assert round(cfg.n_params() / 1e9, 2) == billions and cfg.name.split("/")[0] in ("HuggingFaceTB", "meta-llama")


def test_measure_sets_this_cpus_prediction_beside_the_measured_time(tmp_path, capsys):
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps(TINY_HF))
    out = tmp_path / "r.json"
    args = ["compile", "--chip", "cpu", "--measure", "--config", str(cfg), "--context", "64", "--batch", "2"]
    code, text, _ = run_main(capsys, [*args, "--only", "decode", "--json", str(out)])
    assert code == 0, text
    assert "predicted against measured on this CPU" in text and hardware.cpu_name() in text
    res = json.loads(out.read_text())
    assert res["settings"]["dtype"] == "float32" and res["cpu"] == hardware.cpu_name()
    assert res["ceilings"]["bandwidth_bytes_per_s"] > 0 and res["ceilings"]["matmul_flops_per_s"] > 0
    rows = [r for r in res["programs"] if r["measured_s"] is not None]
    assert {r["name"].split(" [")[0] for r in rows} == {"decode step", "rows decode"}
    for r in rows:  # a roofline is a lower bound: nothing runs faster than its prediction
        assert 0 < r["predicted_s"] <= r["measured_s"]


def test_a_ceiling_understated_beforehand_is_raised_by_the_samples_beside_the_programs():
    # a matmul ceiling measured while a neighbouring process held a core makes predictions too high (a program
    # timed in a quiet moment "beats" its bound); measure() samples the ceiling beside every call and keeps the best
    r = cc.compile_all(cc.Settings(tiny(), dtype="float32", batch=2, context=64), "cpu",
                       only=lambda n: n.startswith("decode step"))  # fmt: skip
    cc.measure(r, prof.Roofline(bandwidth=1e15, peak_flops=1.0), reps=1, matmul_n=128)
    (p,) = [p for p in r.programs if p.measured_s is not None]  # the tensor-parallel one is not timed
    assert r.roofline.peak_flops > 1e6 and r.roofline.bandwidth == 1e15
    assert p.bound == "compute" and 0 < p.predicted_s <= p.measured_s


def test_libtpu_on_a_cpu_host_changes_nothing_for_a_user():
    """`make test` installs libtpu; a notebook or a shell without JAX_PLATFORMS still gets the CPU, quietly (jax
    alone would print libtpu's lines about a TPU it cannot find). A TPU machine, or a choice made, is left alone."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "JAX_PLATFORMS"}
    code = "import jax, jaxlab; print(jax.devices()[0].platform)"
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert p.returncode == 0 and p.stdout.strip() == "cpu" and p.stderr == "", p.stderr
    assert not hardware.keep_jax_off_a_missing_tpu({"JAX_PLATFORMS": "cpu"})
    assert not hardware.keep_jax_off_a_missing_tpu({"TPU_ACCELERATOR_TYPE": "v5litepod-1"})
