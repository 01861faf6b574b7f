"""Two processes, one mesh: a ``jax.distributed`` run over loopback returns the tokens one process does.

Each worker is a fresh Python process with 2 simulated CPU devices; together they form a 4-device
global mesh (data=2 across the processes, model=2 inside each). The workers are started, waited for
with a deadline and killed on failure by :func:`jaxlab.distributed.run`.
"""

from __future__ import annotations

import pytest

import jaxlab
from jaxlab import distributed
from jaxlab.engine.generate import Generator
from jaxlab.engine.model import init_params


@pytest.fixture(scope="module")
def single_process_tokens():
    params = init_params(jaxlab.tiny(), 0)
    prompts = [list(p) for p in distributed.DEFAULT_PROMPTS]
    return [r.generated_ids for r in Generator(params).generate(prompts, 6, ignore_eos=True)]


def test_two_processes_generate_what_one_process_does(single_process_tokens):
    reports = distributed.run(
        num_processes=2,
        local_devices=2,
        mesh="data=2,model=2",
        strategy="auto",
        model="tiny",
        max_new_tokens=6,
        timeout=240,
    )
    assert [r["process_id"] for r in reports] == [0, 1]
    for r in reports:
        assert (r["process_count"], r["device_count"], r["local_device_count"]) == (2, 4, 2)
        assert r["tokens"] == single_process_tokens


def test_a_failing_worker_is_reported_with_its_message():
    with pytest.raises(distributed.DistributedError, match="needs 16 devices"):
        distributed.run(
            num_processes=2, local_devices=2, mesh="data=4,model=4", model="tiny", max_new_tokens=2, timeout=120
        )


def test_worker_env_sets_the_device_count_and_keeps_other_flags():
    env = distributed.worker_env(3, {"XLA_FLAGS": "--xla_foo=1 --xla_force_host_platform_device_count=8", "A": "b"})
    assert env["XLA_FLAGS"] == "--xla_foo=1 --xla_force_host_platform_device_count=3"
    assert env["JAX_PLATFORMS"] == "cpu" and env["A"] == "b"
    assert distributed.free_port() > 0


def test_pod_mode_refuses_a_cpu_only_jax_in_one_sentence():
    from jaxlab.tools.hardware import jax_pin

    distributed.check_pod("tpu", 4)  # a TPU pod slice
    distributed.check_pod("gpu", 2)  # a SLURM GPU cluster
    with pytest.raises(distributed.DistributedError) as e:
        distributed.check_pod("cpu", 1)
    msg = str(e.value)
    assert msg.startswith("jax found no TPU on this worker") and f"jax[tpu]=={jax_pin()}" in msg
    assert "every worker (see README)" in msg and "\n" not in msg


def test_pod_mode_with_a_cpu_only_jax_ends_with_that_sentence():
    import os
    import subprocess
    import sys

    env = dict(os.environ, JAX_PLATFORMS="cpu")
    p = subprocess.run(
        [sys.executable, "-m", "jaxlab.distributed", "--pod"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert p.returncode == 1
    assert p.stderr.strip().splitlines()[-1].startswith("error: jax found no TPU on this worker"), p.stderr
