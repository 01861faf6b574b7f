"""Several processes, one mesh: ``jax.distributed`` over loopback, the code path a TPU pod slice uses.

On a pod slice every host runs the *same* Python program; ``jax.distributed.initialize()`` connects
them (on Cloud TPU it finds the coordinator by itself), after which ``jax.devices()`` lists every
chip of every host, ``jax.local_devices()`` this host's, and a ``Mesh`` over ``jax.devices()`` is
global. Each process holds only its own devices' shards; a jitted program runs on all of them at
once and the collectives cross hosts. :mod:`jaxlab.engine.sharding` builds its inputs with
``jax.make_array_from_callback`` and gathers outputs with ``process_allgather`` so that it runs
unchanged in one process or many.

Here, :func:`run` starts ``num_processes`` Python processes on this machine, each with
``local_devices`` simulated CPU devices, joined by a coordinator on ``127.0.0.1`` and CPU collectives
over gloo (``jax_cpu_collectives_implementation``). Every process calls
:func:`jaxlab.engine.sharding.shard_generate` on the global mesh and returns the tokens it sees.

Launch by hand (two terminals, or ``&``)::

    XLA_FLAGS=--xla_force_host_platform_device_count=2 python -m jaxlab.distributed \\
        --process-id 0 --num-processes 2 --port 12355 --mesh data=2,model=2
    XLA_FLAGS=--xla_force_host_platform_device_count=2 python -m jaxlab.distributed \\
        --process-id 1 --num-processes 2 --port 12355 --mesh data=2,model=2

On a TPU VM or pod slice: install ``jax[tpu]`` (the version jaxlab pins) and jaxlab on every worker,
then start the program on all of them at once (the README has the two ``gcloud ... --worker=all``
commands)::

    gcloud compute tpus tpu-vm ssh NAME --zone=ZONE --worker=all --command="python -m jaxlab.distributed --pod"

``--pod`` lets ``jax.distributed.initialize()`` detect the coordinator, process count and id, checks that
jax really runs on the accelerator (a CPU-only jax on a TPU VM would otherwise run the whole "pod" on each
host's CPU), and by default fits the mesh to ``jax.devices()``: every chip of every host.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import time
from typing import Sequence

from jaxlab.errors import JaxlabError

DEFAULT_PROMPTS = ((1, 17, 42, 99, 7), (1, 5, 6), (1, 250, 3, 3, 8, 9), (1, 64))


class DistributedError(JaxlabError):
    """A worker process failed, timed out, or the processes disagree."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def worker_env(local_devices: int, base: dict | None = None) -> dict:
    """The environment of one worker: CPU backend, ``local_devices`` simulated devices.
    XLA reads the flag when the backend starts, so it must be set before the worker imports jax."""
    env = dict(os.environ if base is None else base)
    flags = [f for f in env.get("XLA_FLAGS", "").split() if not f.startswith("--xla_force_host_platform_device_count")]
    env["XLA_FLAGS"] = " ".join(flags + [f"--xla_force_host_platform_device_count={local_devices}"])
    env["JAX_PLATFORMS"] = "cpu"
    return env


def run(
    num_processes: int = 2,
    local_devices: int = 2,
    mesh: str = "data=2,model=2",
    strategy: str = "auto",
    model: str = "tiny",
    prompts: Sequence[Sequence[int]] = DEFAULT_PROMPTS,
    max_new_tokens: int = 8,
    timeout: float = 180.0,
    port: int | None = None,
    prefill: bool = True,
) -> list[dict]:
    """Start ``num_processes`` workers on this machine, wait for them, return each one's report:
    ``{"process_id", "process_count", "device_count", "local_device_count", "mesh", "strategy", "tokens"}``.

    ``model`` is ``"tiny"`` (random weights, seed 0: every process builds the same ones) or a name/path
    for :func:`jaxlab.load`. Workers that fail or outlive ``timeout`` seconds are killed and a
    :class:`DistributedError` carries the end of their output. ``prefill=False`` feeds prompts through
    the decode step (one compiled program instead of two)."""
    port = port or free_port()
    env = worker_env(local_devices)
    cmd = [
        sys.executable,
        "-m",
        "jaxlab.distributed",
        "--num-processes",
        str(num_processes),
        "--port",
        str(port),
        "--mesh",
        mesh,
        "--strategy",
        strategy,
        "--model",
        model,
        "--max-new-tokens",
        str(max_new_tokens),
        "--prompts",
        json.dumps([list(map(int, p)) for p in prompts]),
        "--timeout",
        str(int(timeout)),
    ]
    if not prefill:
        cmd.append("--no-prefill")
    procs = []
    try:
        for i in range(num_processes):
            procs.append(
                subprocess.Popen(
                    cmd + ["--process-id", str(i)],
                    env=env,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                    text=True,
                    start_new_session=True,
                )
            )
        deadline = time.monotonic() + timeout
        outputs = []
        for p in procs:
            try:
                out, _ = p.communicate(timeout=max(deadline - time.monotonic(), 1))
            except subprocess.TimeoutExpired:
                raise DistributedError(f"a worker did not finish within {timeout:.0f} s") from None
            outputs.append(out)
            if p.returncode != 0:
                raise DistributedError(f"worker exited with status {p.returncode}:\n{out[-3000:]}")
    finally:
        for p in procs:  # on any failure, stop the workers this call started (and their children)
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                p.wait()
    reports = []
    for out in outputs:
        line = next((ln for ln in reversed(out.splitlines()) if ln.startswith("{")), None)
        if line is None:
            raise DistributedError(f"a worker printed no report:\n{out[-3000:]}")
        reports.append(json.loads(line))
    return reports


def check_pod(backend: str, process_count: int, pin: str | None = None) -> None:
    """Raise :class:`DistributedError` (one sentence) unless a ``--pod`` run really runs on accelerators:
    a TPU, or GPUs (a SLURM cluster). A CPU backend there means the worker's jax is CPU-only."""
    if backend in ("tpu", "gpu", "cuda", "rocm"):
        return
    from jaxlab.tools.hardware import jax_pin

    raise DistributedError(
        f"jax found no TPU on this worker (backend {backend}, {process_count} process"
        f"{'es' if process_count != 1 else ''}): install jax[tpu]=={pin or jax_pin()} on every "
        "worker (see README)"
    )


def _worker(args) -> dict:
    import jax

    from jaxlab.tools.compile_cache import enable

    jax.config.update("jax_cpu_collectives_implementation", "gloo")  # CPU collectives across processes
    enable()  # the persistent compilation cache: a second run skips XLA compilation
    if args.pod:
        try:
            jax.distributed.initialize()  # finds the coordinator, the process count and this id by itself
        except (ValueError, RuntimeError) as e:
            from jaxlab.tools.hardware import accelerator_hint

            if accelerator_hint() != "tpu":  # no TPU here (libtpu may be installed only to compile for one)
                check_pod("cpu", 1)
            raise DistributedError(f"jax.distributed.initialize() found no pod: {e}") from None
    else:
        jax.distributed.initialize(
            coordinator_address=f"127.0.0.1:{args.port}",
            num_processes=args.num_processes,
            process_id=args.process_id,
            initialization_timeout=args.timeout,
            heartbeat_timeout_seconds=min(args.timeout, 100),
            shutdown_timeout_seconds=min(args.timeout, 60),
        )
    try:
        if args.pod:
            check_pod(jax.default_backend(), jax.process_count())
        from jaxlab.engine.mesh import fit_mesh, format_mesh, make_mesh, mesh_shape
        from jaxlab.engine.sharding import shard_generate

        if args.model == "tiny":
            from jaxlab.engine.model import init_params
            from jaxlab.io.config import tiny

            params = init_params(tiny(), 0)
        else:
            from jaxlab.engine.loading import load

            params = load(args.model).params
        # the mesh spans jax.devices(): every device of every process (never jax.local_devices())
        mesh = make_mesh(args.mesh or fit_mesh("data+tensor", jax.device_count()))
        tokens = shard_generate(
            params,
            json.loads(args.prompts),
            args.max_new_tokens,
            mesh,
            args.strategy,
            ignore_eos=True,
            prefill=not args.no_prefill,
        )
        return {
            "process_id": jax.process_index(),
            "process_count": jax.process_count(),
            "device_count": jax.device_count(),
            "local_device_count": jax.local_device_count(),
            "backend": jax.default_backend(),
            "mesh": format_mesh(mesh_shape(mesh)),
            "strategy": args.strategy,
            "tokens": tokens,
        }
    finally:
        jax.distributed.shutdown()


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m jaxlab.distributed", description="one worker of a multi-process run")
    p.add_argument("--process-id", type=int, default=0)
    p.add_argument("--num-processes", type=int, default=2)
    p.add_argument("--port", type=int, default=12355)
    p.add_argument("--pod", action="store_true", help="let jax.distributed find the coordinator (TPU pod, SLURM)")
    p.add_argument(
        "--mesh",
        default=None,
        help="e.g. data=2,model=4 (default: data=2,model=2 over loopback; with --pod, fitted to every device "
        "of every host)",
    )
    p.add_argument("--strategy", default="auto")
    p.add_argument("--model", default="tiny")
    p.add_argument("--max-new-tokens", type=int, default=8)
    p.add_argument("--prompts", default=json.dumps([list(p) for p in DEFAULT_PROMPTS]))
    p.add_argument("--timeout", type=int, default=180)
    p.add_argument("--no-prefill", action="store_true", help="feed prompts through the decode step")
    args = p.parse_args(argv)
    if args.mesh is None and not args.pod:
        args.mesh = "data=2,model=2"
    try:
        report = _worker(args)
    except JaxlabError as e:  # a problem the user can fix: one line, as the CLI does
        print(f"error: {e}", file=sys.stderr, flush=True)
        return 1
    print(json.dumps(report), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
