"""Checks for the exercises of notebook 00 (setup).

1. :func:`check_device_env` - an environment for a subprocess that sees ``n`` simulated CPU devices:
   the XLA flag set (once, replacing an older count, keeping the other flags), the CPU platform
   chosen, and the caller's environment left alone; then a real subprocess counts its devices.
2. :func:`check_chat_ids` - one user message through the chat template, compared with the token
   ids of the golden reference file (made with Hugging Face ``transformers``).

Each check prints one PASS/FAIL line and returns a bool.
"""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Callable, Mapping

from jaxlab.lab.exercises import report

__all__ = ["DEVICE_FLAG", "simulated_device_count", "check_device_env", "check_chat_ids"]

DEVICE_FLAG = "--xla_force_host_platform_device_count"


def simulated_device_count(env: Mapping[str, str], timeout: float = 120.0) -> int:
    """Start a fresh Python with ``env`` and return the ``jax.device_count()`` it sees."""
    code = "import jax; print(jax.device_count())"
    out = subprocess.run(
        [sys.executable, "-c", code], env=dict(env), capture_output=True, text=True, timeout=timeout, check=True
    )
    return int(out.stdout.strip().splitlines()[-1])


def _flag_problem(env, n: int, keep: list[str]) -> str | None:
    if not isinstance(env, Mapping):
        return f"returned a {type(env).__name__}, expected a dict of environment variables"
    flags = str(env.get("XLA_FLAGS", "")).split()
    counts = [f for f in flags if f.startswith(DEVICE_FLAG)]
    if counts != [f"{DEVICE_FLAG}={n}"]:
        return f"for n={n}, the device-count flags in XLA_FLAGS are {counts}, expected ['{DEVICE_FLAG}={n}']"
    lost = [f for f in keep if f not in flags]
    if lost:
        return f"for n={n}, XLA_FLAGS lost the flags that were already there: {lost}"
    if env.get("JAX_PLATFORMS") != "cpu":
        return f"for n={n}, JAX_PLATFORMS is {env.get('JAX_PLATFORMS')!r}: the flag multiplies CPU devices, so ask for 'cpu'"
    return None


def check_device_env(device_env: Callable, run_subprocess: bool = True) -> bool:
    """Your ``device_env(n, base)`` -> a new environment dict; ``base`` (e.g. ``os.environ``) untouched."""
    name = "device_env"
    cases = [
        (8, {"PATH": "/usr/bin"}, []),
        (4, {"XLA_FLAGS": "--xla_cpu_multi_thread_eigen=false"}, ["--xla_cpu_multi_thread_eigen=false"]),
        (
            2,
            {"XLA_FLAGS": f"{DEVICE_FLAG}=8 --xla_cpu_multi_thread_eigen=false", "JAX_PLATFORMS": "tpu"},
            ["--xla_cpu_multi_thread_eigen=false"],
        ),
    ]
    for n, base, keep in cases:
        before = dict(base)
        try:
            env = device_env(n, base)
        except NotImplementedError:
            return report(False, name, "not implemented yet", False)
        except Exception as e:
            return report(False, name, f"n={n}: raised {type(e).__name__}: {e}", False)
        if base != before:
            return report(False, name, f"n={n}: it changed the environment it was given; return a new dict", False)
        problem = _flag_problem(env, n, keep)
        if problem:
            return report(False, name, problem, False)
        if "PATH" in base and env.get("PATH") != base["PATH"]:
            return report(False, name, "the other variables (PATH...) must be kept", False)
    if run_subprocess:
        env = device_env(4, dict(os.environ))
        seen = simulated_device_count(env)
        if seen != 4:
            return report(False, name, f"a subprocess with your environment saw {seen} device(s), not 4", False)
        return report(True, name, "flags right in 3 cases, and a fresh process saw 4 CPU devices", False)
    return report(True, name, "flags right in 3 cases", False)


def check_chat_ids(chat_ids: Callable, tokenizer) -> bool:
    """Your ``chat_ids(tokenizer, question)`` vs the golden prompt ids of every reference prompt."""
    from jaxlab.tools.reference import load_golden

    name = "chat_ids"
    for item in load_golden()["prompts"]:
        try:
            got = chat_ids(tokenizer, item["prompt"])
        except NotImplementedError:
            return report(False, name, "not implemented yet", False)
        except Exception as e:
            return report(False, name, f"raised {type(e).__name__}: {e}", False)
        got = [int(i) for i in got]
        want = item["prompt_ids"]
        if got != want:
            at = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
            return report(
                False,
                name,
                f"{item['prompt']!r}: {len(got)} ids vs {len(want)} expected, first "
                f"difference at index {at} (got {got[at : at + 3]}, expected {want[at : at + 3]})",
                False,
            )
    n = len(load_golden()["prompts"])
    return report(True, name, f"{n} prompts give exactly the reference token ids", False)
