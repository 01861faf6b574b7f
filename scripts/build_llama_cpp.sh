#!/usr/bin/env bash
# Build llama.cpp's llama-server, llama-bench and llama-batched-bench from the llama.cpp tree vendored in the
# llama-cpp-python sdist on PyPI (no git clone, no hub): the peer that `jaxlab bench --serve` (and the CPU-speed
# comparisons) measure against, on the same GGUF. Output: $JAXLAB_CACHE/llama-cpp/<version>/bin (default cache
# ~/.cache/jaxlab). Idempotent: a finished build is left alone. Usage: bash scripts/build_llama_cpp.sh [python]
set -euo pipefail
VERSION=0.3.36
PY=${1:-python3}
CACHE=${JAXLAB_CACHE:-$HOME/.cache/jaxlab}
ROOT="$CACHE/llama-cpp/$VERSION"
BIN="$ROOT/bin"
TARGETS="llama-server llama-bench llama-batched-bench"
if [ -x "$BIN/llama-server" ] && [ -x "$BIN/llama-bench" ] && [ -x "$BIN/llama-batched-bench" ] && [ -f "$BIN/.no-amx" ]; then
  echo "llama.cpp $VERSION already built: $BIN"; exit 0
fi
for tool in cmake g++; do
  command -v "$tool" >/dev/null || { echo "building llama.cpp needs $tool: install it (Debian: apt-get install cmake g++)" >&2; exit 1; }
done
mkdir -p "$ROOT"
if [ ! -d "$ROOT/src" ]; then
  echo "downloading the llama-cpp-python==$VERSION sdist from PyPI"
  "$PY" -m pip download -q --no-deps --no-binary :all: "llama-cpp-python==$VERSION" -d "$ROOT/dl"
  tar -xzf "$ROOT"/dl/llama_cpp_python-$VERSION.tar.gz -C "$ROOT"
  mv "$ROOT/llama_cpp_python-$VERSION/vendor/llama.cpp" "$ROOT/src"
  rm -rf "$ROOT/llama_cpp_python-$VERSION" "$ROOT/dl"
fi
# This CPU's own vector instructions (AVX-512 where it has them), read from /proc/cpuinfo, as -march=native would
# give — but never AMX: a CPU may advertise it while the kernel or the VM refuses the tile state (seen here:
# GGML_NATIVE=ON built AMX kernels and llama-server died with SIGILL on its first matmul).
FLAGS=$(grep -m1 '^flags' /proc/cpuinfo 2>/dev/null || true)
has() { case " $FLAGS " in *" $1 "*) echo ON;; *) echo OFF;; esac; }
ISA="-DGGML_NATIVE=OFF -DGGML_AVX=$(has avx) -DGGML_AVX2=$(has avx2) -DGGML_FMA=$(has fma) -DGGML_F16C=$(has f16c)"
ISA="$ISA -DGGML_BMI2=$(has bmi2) -DGGML_AVX_VNNI=$(has avx_vnni) -DGGML_AVX512=$(has avx512f)"
ISA="$ISA -DGGML_AVX512_VBMI=$(has avx512vbmi) -DGGML_AVX512_VNNI=$(has avx512_vnni) -DGGML_AVX512_BF16=$(has avx512_bf16)"
ISA="$ISA -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF"
echo "instruction sets: $ISA"
# shellcheck disable=SC2086
cmake -S "$ROOT/src" -B "$ROOT/build" -G Ninja -DCMAKE_BUILD_TYPE=Release $ISA \
  -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_CURL=OFF >"$ROOT/cmake.log" \
  || { tail -20 "$ROOT/cmake.log" >&2; echo "cmake failed configuring llama.cpp; full log: $ROOT/cmake.log" >&2; exit 1; }
echo "building $TARGETS with $(nproc) jobs (about 7 minutes on 2 cores)"
cmake --build "$ROOT/build" --target $TARGETS -j "$(nproc)" >"$ROOT/build.log" \
  || { tail -20 "$ROOT/build.log" >&2; echo "building llama.cpp failed; full log: $ROOT/build.log" >&2; exit 1; }
mkdir -p "$BIN"
for t in $TARGETS; do cp "$ROOT/build/bin/$t" "$BIN/"; done
# the shared libraries the tools link against (libllama, libggml*), found through the rpath of build/bin
find "$ROOT/build" -name '*.so*' -exec cp -P {} "$BIN/" \; 2>/dev/null || true
touch "$BIN/.no-amx"
"$BIN/llama-server" --version 2>&1 | head -2
echo "llama.cpp $VERSION built: $BIN"
