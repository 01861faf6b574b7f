#!/usr/bin/env bash
# jaxlab on a lent GPU machine (the device tool's nvidia-h200): one short, prepared run in two calls.
#
#   bash scripts/device_run.sh stage1          # carry .whl and .gpu/gguf.part1; < 60 s
#   bash scripts/device_run.sh stage2 [BUDGET] # carry .gpu/gguf.part2; ends within BUDGET s (default 345)
#   bash scripts/device_run.sh stage3 [BUDGET] # optional, same warm machine: extended bench + cut notebooks
#
# The 94 MB GGUF does not fit one call beside the tree, so stage1 keeps part 1 (and the wheels, installed to
# /tmp/site) outside the repository; stage2 must come within the machine's 30 s warm window. Nothing here aborts the
# run: every step logs OK / FAIL / CUT (timed out) and the next one goes on. Results: $OUT (at most 8 files).
#
# Overridable for a dry run on a machine without a GPU: PY, SITE, PARTS, JAXLAB_CACHE, STATE, PLAT, OUT, NB_JOBS,
# NB_ONLY (e.g. "02,05"), BENCH_ARGS, GEN_S, BENCH_S, BENCH3A_ARGS, BENCH3B_ARGS.
set -u

MODE=${1:-}
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT" || exit 1

PY=${PY:-python3}
SITE=${SITE:-/tmp/site}
PARTS=${PARTS:-/root/jaxlab-model}           # the model's pieces, kept between calls (outside the repo)
export JAXLAB_CACHE=${JAXLAB_CACHE:-/root/jaxlab-cache}
STATE=${STATE:-/root/jaxlab-state}           # executed notebooks and logs, kept for stage3
PLAT=${PLAT:-cuda}
OUT=${OUT:-/tmp/jaxlab-out}
NB_JOBS=${NB_JOBS:-8}
NB_ONLY=${NB_ONLY:-}
BENCH_S=${BENCH_S:-150} # stage2's hard limits: jaxlab bench, then jaxlab info + generate (beside the notebooks)
GEN_S=${GEN_S:-120}
MODEL_NAME=SmolLM2-135M-Instruct.Q4_1.gguf
MODEL_SHA=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
MODEL_SIZE=98362432
PART1_SHA=9d20a289134a42712916ab29cf40cb0301b908171199ed6b474bf3cdeb21f6c8
PART2_SHA=53860c18ea52d9e043c689a7482a60b782c6b9453ef814ff516744cab02ede4c
MODEL="$JAXLAB_CACHE/models/$MODEL_NAME"

mkdir -p "$OUT" "$STATE"
T0=$(date +%s)
SUMMARY="$OUT/summary.txt"

now() { date +%s; }
log() { echo "[$(date +%H:%M:%S) +$(($(now) - T0))s] $*"; }
note() { echo "$*" >>"$SUMMARY"; log "$*"; }

# step NAME SECONDS CMD...: run CMD under a hard timeout; log and record OK / FAIL rc / CUT; never abort.
step() {
    local name=$1 secs=$2
    shift 2
    if [ "$secs" -lt 5 ]; then
        note "CUT   $name: not started, no time left"
        return 0
    fi
    local t=$(now)
    log "BEGIN $name (hard timeout ${secs}s)"
    timeout -k 10 "$secs" "$@"
    local rc=$?
    local d=$(($(now) - t))
    if [ $rc -eq 124 ] || [ $rc -eq 137 ]; then
        note "CUT   $name: killed at its ${secs}s timeout (${d}s)"
    elif [ $rc -ne 0 ]; then
        note "FAIL  $name: rc=$rc (${d}s)"
    else
        note "OK    $name (${d}s)"
    fi
    return 0
}

# left [RESERVE]: seconds to the deadline, minus RESERVE
left() { echo $((DEADLINE - $(now) - ${1:-0})); }
# cap SECONDS [RESERVE]: SECONDS, or less if the deadline is nearer
cap() {
    local l
    l=$(left "${2:-0}")
    [ "$1" -lt "$l" ] && echo "$1" || echo "$l"
}

jaxlab_cli() { "$PY" -c 'import sys; from jaxlab.cli import main; sys.exit(main())' "$@"; }

machine_info() {
    echo "== machine"
    timeout 20 nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv,noheader \
        | sed 's/^/gpu: /'
    lscpu | grep 'Model name' | sed 's/^ *//'
    echo "cpus: $(nproc)  mem: $(free -g | awk '/Mem:/ {print $2}') GiB  kernel: $(uname -r)"
}

versions() {
    "$PY" - <<'EOF'
import platform, sys
from importlib import metadata
print("python", platform.python_version(), sys.executable)
for p in ("jax", "jaxlib", "jax-cuda13-plugin", "jax-cuda13-pjrt", "flax", "optax", "numpy", "ml_dtypes",
          "tokenizers", "safetensors", "huggingface-hub", "torch", "transformers", "typing_extensions", "anyio",
          "psutil", "matplotlib", "prometheus_client", "httpx", "gguf", "nbclient", "ipykernel", "openai"):
    try:
        v = metadata.version(p)
        where = metadata.distribution(p).locate_file("")
    except metadata.PackageNotFoundError:
        v, where = "-", ""
    print(f"  {p:20s} {v:14s} {where}")
EOF
}

use_site() {
    export PYTHONPATH="$SITE:$ROOT"
    export JAX_PLATFORMS=$PLAT
    export XLA_PYTHON_CLIENT_PREALLOCATE=false
    export PYTHONUNBUFFERED=1
    export MPLBACKEND=Agg
    export TOKENIZERS_PARALLELISM=false
}

install_wheels() {
    if ls .whl/*.whl >/dev/null 2>&1; then
        "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" .whl/*.whl
    else
        echo "no .whl/ here (not carried)"
        return 1
    fi
}

# ---------------------------------------------------------------------------------------------------------------
# begin NAME BUDGET: a stage's deadline, a fresh summary, and everything it prints also in $OUT/NAME.log
begin() {
    DEADLINE=$((T0 + $2))
    : >"$SUMMARY"
    exec > >(tee -a "$OUT/$1.log") 2>&1
    log "$1 in $ROOT, budget $2s"
}

stage1() {
    begin stage1 55
    timeout 20 nvidia-smi
    machine_info | tee -a "$SUMMARY"
    step "versions" "$(cap 20)" bash "$SELF" _versions
    step "install wheels to $SITE" "$(cap 40)" bash "$SELF" _install
    mkdir -p "$PARTS"
    if [ -f .gpu/gguf.part1 ]; then
        step "keep part 1" "$(cap 15)" cp .gpu/gguf.part1 "$PARTS/gguf.part1"
        echo "$PART1_SHA  $PARTS/gguf.part1" | step "sha256 part 1" "$(cap 10)" sha256sum -c -
    else
        note "FAIL  .gpu/gguf.part1 was not carried"
    fi
    use_site
    step "jax.devices()" "$(cap 30)" "$PY" -c 'import jax; print(jax.__version__, jax.default_backend(), jax.devices())'
    step "imports + tiny model" "$(cap 30)" "$PY" -c '
import jaxlab, jaxlab.cli, jaxlab.serve.app, jaxlab.bench.run, gguf, nbclient, nbformat, ipykernel, IPython, zmq
import openai, starlette, uvicorn, ipywidgets, flax, optax
print("imports ok: jaxlab from", jaxlab.__file__, "| flax", flax.__version__, "| optax", optax.__version__)
from jaxlab.engine.model import init_params
p = init_params(jaxlab.tiny(), 0)  # flax nnx (List, to_flat_state) on this image: a 3-layer random model
print("tiny model built with this flax:", p.nbytes(), "bytes")'
    log "stage1 done"
    cat "$SUMMARY"
}

# ---------------------------------------------------------------------------------------------------------------
assemble() {
    mkdir -p "$JAXLAB_CACHE/models"
    if [ -f "$MODEL" ] && [ "$(stat -c %s "$MODEL")" = "$MODEL_SIZE" ] \
        && echo "$MODEL_SHA  $MODEL" | sha256sum -c --quiet - 2>/dev/null; then
        echo "model already in place: $MODEL"
        return 0
    fi
    local p1 p2
    p1=$(ls "$PARTS/gguf.part1" .gpu/gguf.part1 2>/dev/null | head -1)
    p2=$(ls .gpu/gguf.part2 "$PARTS/gguf.part2" 2>/dev/null | head -1)
    if [ -z "$p1" ] || [ -z "$p2" ]; then
        echo "missing piece(s): part1='$p1' part2='$p2' (stage1's state is lost when the machine went back)"
        # keep the piece that is here, so that one more call carrying the other (stage1 && stage2) completes the file
        mkdir -p "$PARTS"
        [ -n "$p2" ] && [ "$p2" != "$PARTS/gguf.part2" ] && cp "$p2" "$PARTS/gguf.part2" && echo "kept $p2 in $PARTS"
        [ -n "$p1" ] && [ "$p1" != "$PARTS/gguf.part1" ] && cp "$p1" "$PARTS/gguf.part1" && echo "kept $p1 in $PARTS"
        return 3
    fi
    cat "$p1" "$p2" >"$MODEL.partial" && mv "$MODEL.partial" "$MODEL"
    echo "$MODEL_SHA  $MODEL" | sha256sum -c - && return 0
    printf '%s  %s\n%s  %s\n' "$PART1_SHA" "$p1" "$PART2_SHA" "$p2" | sha256sum -c -  # which piece is damaged
    rm -f "$MODEL"
    return 4
}

run_notebooks() { # run_notebooks SECONDS: every notebook that can run, NB_JOBS at a time, all done within SECONDS
    local budget=${1:-200}
    # notebook 08 builds its meshes from 8 simulated CPU devices when there are fewer than 4 accelerators, so the
    # kernels see the CPU backend beside the GPU (the GPU stays the default backend: it is listed first)
    [ "$JAX_PLATFORMS" = cpu ] || export JAX_PLATFORMS="$JAX_PLATFORMS,cpu"
    echo "notebook kernels: JAX_PLATFORMS=$JAX_PLATFORMS, $NB_JOBS at a time, ${budget}s in all"
    write_runner
    mkdir -p "$STATE/nb"
    "$PY" /tmp/jaxlab_nbrun.py parent "$ROOT" "$STATE/nb" "$(($(now) + budget))" "$NB_JOBS" "$NB_ONLY"
}

generate() {
    {
        echo "== jaxlab info"
        jaxlab_cli info
        echo "== jaxlab generate --json: one batch of 4, greedy, the CLI's default dtype on this backend"
        jaxlab_cli generate --json --max-new-tokens 32 "What is the capital of France?" "Name a color." \
            "What is 2+2?" "Write a haiku about the sea."
    } >"$OUT/generate.txt" 2>&1
}

bench() { # bench NAME [noplot]: jaxlab bench $BENCH_ARGS, report in $OUT/NAME.txt, numbers in $OUT/NAME.json
    set -o pipefail
    local plot=(--plot "$OUT/$1-roofline.png")
    [ "${2:-}" = noplot ] && plot=()
    # shellcheck disable=SC2086
    jaxlab_cli bench $BENCH_ARGS --targets --json "$OUT/$1.json" "${plot[@]}" 2>&1 | tee "$OUT/$1.txt"
}

pack() {
    tar -czf "$OUT/notebooks.tar.gz" -C "$STATE" nb 2>&1 | tail -3
    ls -la "$OUT"
}

stage2() {
    begin stage2 "${1:-345}"
    machine_info | tee -a "$SUMMARY"
    if ! "$PY" -c "import sys; sys.path.insert(0, '$SITE'); import nbclient, gguf" 2>/dev/null; then
        note "WARN  $SITE lacks the wheels (stage1's state lost?): installing from .whl if carried"
        step "install wheels to $SITE" "$(cap 40)" bash "$SELF" _install
    fi
    step "assemble + sha256 of the GGUF" "$(cap 30)" bash "$SELF" _assemble
    if [ ! -f "$MODEL" ]; then
        note "STOP  no verified model: nothing else can run. Recovery: at once (warm 30 s), one call carrying .whl and .gpu/gguf.part1 running: bash scripts/device_run.sh stage1; bash scripts/device_run.sh stage2 300"
        return 0
    fi
    use_site
    bash "$SELF" _versions | tee -a "$SUMMARY"
    echo "JAX_PLATFORMS=$JAX_PLATFORMS JAXLAB_CACHE=$JAXLAB_CACHE PYTHONPATH=$PYTHONPATH" | tee -a "$SUMMARY"

    # (i) jaxlab bench first, alone on the machine (it also converts the GGUF once into params/ of the cache, so no
    # two notebooks race to do that): prefill, decode at batch 1/8/32 beside transformers (PyTorch eager on the CPU,
    # same GGUF), the measured ceilings, roofline %. Stages, speculative, quantized rows and the TTFT children are
    # left to stage3 (their compiles would not fit). Reps 2, as benchmarks/results-cpu.json.
    export BENCH_ARGS=${BENCH_ARGS:---batch-sizes 1,8,32 --prompt-len 128 --new-tokens 128 --reps 2 --no-ttft --no-stages --no-speculative --no-quant}
    step "jaxlab bench $BENCH_ARGS" "$(cap "$BENCH_S" 170)" bash "$SELF" _bench bench
    if [ ! -s "$OUT/bench.json" ] && ! grep -q "^CUT   jaxlab bench" "$SUMMARY" && [ "$(left 170)" -ge 60 ]; then
        export BENCH_ARGS="$BENCH_ARGS --no-peer"
        step "jaxlab bench $BENCH_ARGS (again, without the peer)" "$(cap "$BENCH_S" 170)" bash "$SELF" _bench bench
    fi

    # (ii) jaxlab info + generate (a CLI check, not a timing) beside (iii) the notebooks, NB_JOBS at a time, each
    # with its own wall limit, all within the deadline
    local g gen=""
    g=$(cap "$GEN_S" 25)
    if [ "$g" -ge 10 ]; then
        log "BEGIN jaxlab info + generate, in the background (hard timeout ${g}s)"
        timeout -k 5 "$g" bash "$SELF" _generate &
        gen=$!
    else
        note "CUT   jaxlab info + generate: not started, no time left"
    fi
    step "notebooks ($NB_JOBS at a time)" "$(cap 400 12)" bash "$SELF" _notebooks "$(left 20)"
    if [ -n "$gen" ]; then
        wait "$gen"
        local rc=$?
        if [ $rc -eq 0 ]; then note "OK    jaxlab info + generate"; else note "FAIL  jaxlab info + generate: rc=$rc (124: cut)"; fi
        cat "$OUT/generate.txt"
    fi
    cat "$STATE/nb/status.txt" >>"$SUMMARY" 2>/dev/null
    cp "$OUT/stage2.log" "$STATE/nb/stage2.log" 2>/dev/null
    pack
    log "stage2 done in $(($(now) - T0))s"
    cat "$SUMMARY"
    sleep 1
}

# stage3: only on the same warm machine after stage2: the notebooks stage2 cut (at most half the budget), then the
# bench sections stage2 left: the decode stages and speculative decoding at batch 1, then the quantized rows
stage3() {
    begin stage3 "${1:-240}"
    if [ ! -f "$MODEL" ]; then
        note "STOP  no model in $MODEL (the machine went back): stage3 needs stage2's warm machine"
        return 0
    fi
    use_site
    machine_info | tee -a "$SUMMARY"
    local redo
    redo=$(awk '$1=="CUT" || $1=="SKIPPED" || $1=="TIMEOUT" {print substr($2,1,2)}' "$STATE/nb/status.txt" 2>/dev/null \
        | paste -sd, -)
    if [ -n "$redo" ]; then
        mv "$STATE/nb/status.txt" "$STATE/nb/status-stage2.txt"
        export NB_ONLY=$redo
        local nb_s=$(($(left 20) / 2))
        step "notebooks cut in stage2: $redo" "$((nb_s + 10))" bash "$SELF" _notebooks "$nb_s"
        cat "$STATE/nb/status.txt" >>"$SUMMARY" 2>/dev/null
    fi
    # two separate runs, so that one cut at its limit does not cost the other's numbers
    export BENCH_ARGS=${BENCH3A_ARGS:---batch-sizes 1 --prompt-len 128 --new-tokens 128 --reps 2 --no-peer --no-ttft --stages --speculative --no-quant}
    step "jaxlab bench $BENCH_ARGS" "$(cap 600 $(( $(left) / 2 )))" bash "$SELF" _bench bench3a noplot
    export BENCH_ARGS=${BENCH3B_ARGS:---quant-only --prompt-len 128 --new-tokens 128 --reps 2 --quant-formats int8,w8a8 --quant-kv float32,int8 --quant-batch-sizes 1,8,32}
    step "jaxlab bench $BENCH_ARGS" "$(cap 600 15)" bash "$SELF" _bench bench3b noplot
    cp "$OUT/stage3.log" "$STATE/nb/stage3.log" 2>/dev/null
    pack
    cat "$SUMMARY"
    sleep 1
}

# ---------------------------------------------------------------------------------------------------------------
# The notebook runner (Python): `parent` schedules, one `child` per notebook executes it with nbclient.
write_runner() {
    cat >/tmp/jaxlab_nbrun.py <<'PYEOF'
import asyncio, json, os, signal, subprocess, sys, time
from pathlib import Path

CELL_TIMEOUT = 300          # per cell, as make test's nbval
NB_WALL = 240               # per notebook, hard
MIN_START = 45              # do not start a notebook with less time than this before the deadline
SKIP = {"14": "needs the all-MiniLM-L6-v2 encoder wheel (91 MB), not carried"}


def parent(root, outdir, deadline, jobs, only):
    root, outdir, deadline, jobs = Path(root), Path(outdir), float(deadline), int(jobs)
    try:
        order = json.loads((root / "tests" / "durations.json").read_text())["seconds"]
    except Exception:
        order = {}
    nbs = sorted((root / "notebooks").glob("[0-9][0-9]_*.ipynb"))
    wanted = {x.strip().zfill(2) for x in only.split(",") if x.strip()} if only else None
    lines = []
    status = outdir / "status.txt"

    def record(line):
        lines.append(line)
        print(line, flush=True)
        status.write_text("\n".join(lines) + "\n")

    queue = []
    for nb in nbs:
        key = nb.name[:2]
        if wanted is not None and key not in wanted:
            continue
        if key in SKIP and (wanted is None or key not in wanted):
            record(f"SKIP     {nb.stem:36s} {SKIP[key]}")
            continue
        queue.append(nb)
    queue.sort(key=lambda p: -order.get(f"notebooks/{p.name}", 30.0))  # longest first
    running = {}

    def on_term(signum, frame):  # the step's timeout fired: take every notebook child and kernel down with us
        for nb, (p, *_rest) in running.items():
            kill(p.pid, outdir / f"{nb.stem}.kernel.pid")
            record(f"KILLED   {nb.stem:36s} the runner was stopped")
        sys.exit(1)

    signal.signal(signal.SIGTERM, on_term)
    while queue or running:
        while queue and len(running) < jobs:
            nb = queue.pop(0)
            rem = deadline - time.time()
            if rem < MIN_START:
                record(f"SKIPPED  {nb.stem:36s} not started: {rem:.0f}s left before the deadline (cut)")
                continue
            wall = int(min(NB_WALL, rem - 8))
            log = open(outdir / f"{nb.stem}.log", "w")
            env = dict(os.environ, IPYTHONDIR=f"/tmp/ipython-{nb.stem[:2]}")
            p = subprocess.Popen(
                [sys.executable, __file__, "child", str(nb), str(outdir / nb.name), str(wall)],
                stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True,
            )
            running[nb] = (p, time.time(), wall, log)
            print(f"start    {nb.stem} (wall {wall}s)", flush=True)
        time.sleep(0.5)
        for nb, (p, t0, wall, log) in list(running.items()):
            if p.poll() is None and time.time() - t0 < wall + 10:
                continue
            if p.poll() is None:  # the child did not stop itself: kill it, its group and its kernel
                kill(p.pid, outdir / f"{nb.stem}.kernel.pid")
                p.wait()
            log.close()
            res = outdir / f"{nb.stem}.result.json"
            try:
                r = json.loads(res.read_text())
            except Exception:
                r = {"status": "KILLED", "error": f"no result (rc {p.returncode}); see {nb.stem}.log"}
            kill(None, outdir / f"{nb.stem}.kernel.pid")  # a kernel left behind holds GPU memory
            where = f" [cell index {r['cell']}]" if r.get("cell") is not None and r["status"] != "PASS" else ""
            record(f"{r['status']:8s} {nb.stem:36s} {time.time() - t0:6.1f}s{where} {r.get('error', '')}".rstrip())
            del running[nb]
    return 0


def kill(pid, pidfile):
    pids = [pid] if pid else []
    try:
        pids.append(int(pidfile.read_text()))
    except Exception:
        pass
    for q in pids:
        for f in (lambda: os.killpg(q, signal.SIGKILL), lambda: os.kill(q, signal.SIGKILL)):
            try:
                f()
            except Exception:
                pass


def child(nb_path, out_path, wall):
    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError, CellTimeoutError

    nb_path, out_path, wall = Path(nb_path), Path(out_path), float(wall)
    stem = nb_path.stem
    nb = nbformat.read(nb_path, as_version=4)
    client = NotebookClient(nb, timeout=CELL_TIMEOUT, kernel_name="python3", shutdown_kernel="immediate",
                            resources={"metadata": {"path": str(nb_path.parent)}})
    state = {"cell": None}
    pidfile = out_path.parent / f"{stem}.kernel.pid"

    def on_cell_start(cell, cell_index):
        state["cell"] = cell_index
        if not pidfile.exists():
            try:
                pidfile.write_text(str(client.km.provisioner.pid))
            except Exception:
                pass

    client.on_cell_start = on_cell_start
    t0 = time.time()
    r = {"status": "PASS", "cell": None, "error": ""}
    try:
        asyncio.run(asyncio.wait_for(client.async_execute(), timeout=wall))
    except (asyncio.TimeoutError, TimeoutError):
        r.update(status="TIMEOUT", error=f"notebook wall limit {wall:.0f}s reached")
    except CellTimeoutError as e:
        r.update(status="FAIL", error="cell timeout: " + str(e).strip().splitlines()[0][:200])
    except CellExecutionError as e:
        r.update(status="FAIL", error=f"{e.ename}: {str(e.evalue).strip().splitlines()[0] if e.evalue else ''}"[:300])
    except Exception as e:
        r.update(status="FAIL", error=f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"[:300])
    if r["status"] != "PASS" and time.time() - t0 >= wall - 1:  # cancelled at the wall (the kernel "died" then)
        r.update(status="TIMEOUT", error=f"notebook wall limit {wall:.0f}s reached ({r['error']})")
    r["cell"] = state["cell"]
    r["seconds"] = round(time.time() - t0, 1)
    try:
        nbformat.write(nb, out_path)
    except Exception as e:
        r["error"] += f" (could not write the notebook: {e})"
    (out_path.parent / f"{stem}.result.json").write_text(json.dumps(r))
    print(json.dumps(r), flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "parent":
        sys.exit(parent(*sys.argv[2:7]))
    child(*sys.argv[2:5])
PYEOF
}

SELF="$ROOT/scripts/device_run.sh"
export PY SITE PARTS STATE PLAT OUT NB_JOBS NB_ONLY
case "$MODE" in
stage1) stage1 ;;
stage2) stage2 "${2:-345}" ;;
stage3) stage3 "${2:-240}" ;;
_versions) versions; exit $? ;;
_install) install_wheels; exit $? ;;
_assemble) assemble; exit $? ;;
_generate) generate; exit $? ;;
_bench) bench "$2" "${3:-}"; exit $? ;;
_notebooks) run_notebooks "${2:-200}"; exit $? ;;
*)
    echo "usage: bash scripts/device_run.sh stage1 | stage2 [BUDGET_S] | stage3 [BUDGET_S]"
    exit 2
    ;;
esac
exit 0
