"""Published chip peaks, device_kind -> chip, and the labels of figures measured in child processes.

All hermetic: no accelerator needed. The parent's backend is passed in (or jax's answer monkeypatched),
so the TPU case is tested on a CPU.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from jaxlab.tools import hardware as hw

REQUIRED = (
    "TPU v2",
    "TPU v3",
    "TPU v4",
    "TPU v5e",
    "TPU v5p",
    "TPU v6e",
    "NVIDIA T4",
    "NVIDIA L4",
    "NVIDIA A100 40GB SXM",
    "NVIDIA A100 80GB SXM",
    "NVIDIA H100 SXM",
    "NVIDIA H200",
)


def test_every_required_chip_is_there_with_plausible_numbers():
    for name in REQUIRED:
        c = hw.CHIPS[name]
        assert 20e12 <= c.peak_flops <= 2000e12, name  # dense bf16/fp16: tens to ~1000 TFLOP/s
        assert 200e9 <= c.hbm_bandwidth <= 6000e9, name  # GDDR6 (T4, L4) up to HBM3e (H200)
        assert 8e9 <= c.hbm_bytes <= 200e9, name
        assert c.source and c.peak_dtype in ("bfloat16", "float16")
        assert 10 < c.ridge < 1000
    assert hw.CHIPS["NVIDIA T4"].peak_dtype == "float16"  # the T4 has no bfloat16
    # newer generations are faster; dense figures, not NVIDIA's "with sparsity" ones
    assert hw.CHIPS["TPU v6e"].peak_flops > hw.CHIPS["TPU v5p"].peak_flops > hw.CHIPS["TPU v4"].peak_flops
    assert hw.CHIPS["NVIDIA H100 SXM"].peak_flops < 1000e12 and hw.CHIPS["NVIDIA L4"].peak_flops < 200e12
    assert hw.CHIPS["NVIDIA H200"].hbm_bandwidth > hw.CHIPS["NVIDIA H100 SXM"].hbm_bandwidth
    v3 = hw.CHIPS["TPU v3"]  # two TensorCores per chip, each a jax device
    assert v3.devices_per_chip == 2 and v3.device_peak_flops == v3.peak_flops / 2


@pytest.mark.parametrize(
    "kind,name",
    [
        ("TPU v2", "TPU v2"),
        ("TPU v3", "TPU v3"),
        ("TPU v4", "TPU v4"),
        ("TPU v5 lite", "TPU v5e"),
        ("TPU v5e", "TPU v5e"),
        ("TPU v5", "TPU v5p"),
        ("TPU v5p", "TPU v5p"),
        ("TPU v6 lite", "TPU v6e"),
        ("Tesla T4", "NVIDIA T4"),
        ("NVIDIA L4", "NVIDIA L4"),
        ("NVIDIA A100-SXM4-40GB", "NVIDIA A100 40GB SXM"),
        ("NVIDIA A100-SXM4-80GB", "NVIDIA A100 80GB SXM"),
        ("NVIDIA H100 80GB HBM3", "NVIDIA H100 SXM"),
        ("NVIDIA H200", "NVIDIA H200"),
    ],
)
def test_device_kind_maps_to_its_chip(kind, name):
    assert hw.chip_for(kind).name == name


@pytest.mark.parametrize(
    "kind",
    [
        "cpu",
        "",
        None,
        "TPU v4 lite",
        "TPU7x",
        "NVIDIA H100 PCIe",
        "NVIDIA A100 80GB PCIe",
        "NVIDIA GeForce RTX 4090",
        "NVIDIA H200 NVL",
    ],
)
def test_cpu_and_unknown_chips_have_no_entry(kind):
    assert hw.chip_for(kind) is None


def test_describe_peaks():
    assert hw.describe_peaks(None, "cpu") == "CPU: no published peak; see `jaxlab bench` for measured ceilings"
    assert "no published peaks" in hw.describe_peaks(None, "TPU7x")
    line = hw.describe_peaks(hw.CHIPS["TPU v5e"])
    assert "197 TFLOP/s bfloat16" in line and "819 GB/s" in line and "Google Cloud" in line
    assert "2 jax devices" in hw.describe_peaks(hw.CHIPS["TPU v2"])


def test_figure_note_labels_figures_from_another_backend():
    assert hw.figure_note("tpu", "tpu") is None and hw.figure_note("cpu", "cpu") is None
    assert hw.figure_note("cpu", "tpu") == "CPU figure: the TPU is held by this process"
    assert hw.figure_note("cpu", "gpu") == "CPU figure: the child process could not use the GPU"
    assert hw.figure_note(None, "tpu").startswith("unknown figure")


def test_figure_note_defaults_to_this_process_backend(monkeypatch):
    import jax

    monkeypatch.setattr(jax, "default_backend", lambda: "tpu")
    assert hw.figure_note("cpu") == "CPU figure: the TPU is held by this process"


def test_child_env_shares_the_device_unless_this_process_holds_a_tpu(monkeypatch):
    import jax

    base = {"JAX_PLATFORMS": "", "A": "b"}
    monkeypatch.setattr(hw, "backend_started", lambda: False)  # parent has not taken the device: child may
    env = hw.child_env(base)
    assert env["XLA_PYTHON_CLIENT_PREALLOCATE"] == "false" and env["JAX_PLATFORMS"] == "" and env["A"] == "b"
    monkeypatch.setattr(hw, "backend_started", lambda: True)
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")  # GPUs are shared
    assert hw.child_env(base)["JAX_PLATFORMS"] == ""
    monkeypatch.setattr(jax, "default_backend", lambda: "tpu")  # a held TPU: explicitly the CPU, then labelled
    assert hw.child_env(base)["JAX_PLATFORMS"] == "cpu"


def test_accelerator_hint_and_fallback_note(tmp_path):
    assert hw.accelerator_hint({}, root=str(tmp_path)) is None
    assert hw.accelerator_hint({"TPU_ACCELERATOR_TYPE": "v5litepod-1"}, root=str(tmp_path)) == "tpu"
    (tmp_path / "dev").mkdir()
    (tmp_path / "dev" / "accel0").touch()
    assert hw.accelerator_hint({}, root=str(tmp_path)) == "tpu"
    (tmp_path / "dev" / "accel0").unlink()
    (tmp_path / "dev" / "nvidia0").touch()
    assert hw.accelerator_hint({}, root=str(tmp_path)) == "gpu"

    assert hw.fallback_note("tpu", "tpu", {}) is None and hw.fallback_note("cpu", None, {}) is None
    held = hw.fallback_note("cpu", "tpu", {})
    assert "has a TPU" in held and "holds the TPU" in held and "CPU figures" in held
    assert "JAX_PLATFORMS=cpu" in hw.fallback_note("cpu", "tpu", {"JAX_PLATFORMS": "cpu"})


def test_jax_pin_is_the_pyproject_pin():
    deps = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())["project"]
    pin = next(d.split("==")[1] for d in deps["dependencies"] if d.startswith("jax=="))
    assert hw.jax_pin() == pin


def test_backend_started_is_true_once_jax_runs():
    import jax

    jax.devices()
    assert hw.backend_started()


def test_free_memory_is_what_the_host_says_is_available(monkeypatch):
    free = hw.free_memory_bytes()
    with open("/proc/meminfo") as f:
        available = next(int(line.split()[1]) * 1024 for line in f if line.startswith("MemAvailable:"))
    assert free is not None and 0 < free and abs(free - available) < available * 0.2  # read a moment apart

    class Accelerator:  # an accelerator says its limit and what is in use
        platform = "gpu"

        def memory_stats(self):
            return {"bytes_limit": 80 << 30, "bytes_in_use": 3 << 30}

    assert hw.free_memory_bytes(Accelerator()) == 77 << 30
