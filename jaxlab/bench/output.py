"""The files a run writes: every number as JSON (:func:`write_json`) and the roofline plot (:func:`plot`)."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path


def plot(res: dict, path: str) -> None:
    """The float32 prefill and decode rows on the roofline of the measured ceilings, as a PNG (folders created)."""
    os.environ.setdefault("MPLBACKEND", "Agg")
    import matplotlib

    matplotlib.use("Agg")
    from jaxlab.tools import profile

    ceil = res["ceilings"]
    roof = profile.Roofline(ceil["bandwidth_bytes_per_s"], ceil["matmul_flops_per_s"])
    pre = res["prefill"]
    meta = res["meta"]
    points = {
        f"prefill b1 ({pre['prompt_len']} tok)": (pre["flops_model"], pre["bytes_model"], pre["ours_s"]["median"])
    }
    for d in res["decode"]:
        points[f"decode b{d['batch']}"] = (d["flops_per_step"], d["bytes_per_step"], d["ours_step_s"]["median"])
    fig = profile.plot_roofline(roof, points)
    fig.axes[0].set_title(
        f"jaxlab bench: SmolLM2-135M float32 on {meta['backend']} ({meta['threads']['schedulable_cpus']} CPUs)"
    )
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    import matplotlib.pyplot as plt

    plt.close(fig)


def jsonable(x):
    """``x`` with every key a string and every value JSON can hold (NaN and inf: None; others: float or str)."""
    if isinstance(x, dict):
        return {str(k): jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [jsonable(v) for v in x]
    if isinstance(x, float) and (math.isnan(x) or math.isinf(x)):
        return None
    if isinstance(x, (str, int, float, bool)) or x is None:
        return x
    try:
        return float(x)
    except (TypeError, ValueError):
        return str(x)


def write_json(res: dict, path: str) -> None:
    """The results dict as indented JSON (folders created)."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(jsonable(res), indent=1) + "\n")


def host_meta(**extra) -> dict:
    """The host facts every one-purpose run (``--trace``, ``--serve``, ``--encoder``, ``--retrieval``) records:
    the CPU model, its count, the UTC date, the package versions and the load average, plus ``extra``."""
    import time

    from jaxlab.bench.harness import cpu_name, versions
    from jaxlab.engine import hugepages
    from jaxlab.engine.kernels import cpu as cpu_kernels

    return {"cpu": cpu_name(), "cpus": os.cpu_count(), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "versions": versions(), "load_average": os.getloadavg(),
            "cpu_kernels": cpu_kernels.status().reason, "huge_pages": hugepages.status().reason,
            **extra}  # fmt: skip


def target_status_lines(targets: list[dict]) -> str:
    """``  PASS  <target>: <measured>`` per target, under a header (what ``--targets`` adds to the report)."""
    text = "\nTargets (from the ratios above)\n"
    for t in targets:
        v = "-" if t["measured"] is None else f"{t['measured']:.2f}"
        text += f"  {t['status']:4s}  {t['target']}: {v}\n"
    return text


def finish(res: dict, text: str, args, out) -> int:
    """Print the report (with the targets' lines under ``--targets``) and write ``--json``; the run's exit code."""
    if getattr(args, "targets", False) and res.get("targets"):
        text += target_status_lines(res["targets"])
    out.write(text)
    out.flush()
    if getattr(args, "json", None):
        write_json(res, args.json)
    return 0
