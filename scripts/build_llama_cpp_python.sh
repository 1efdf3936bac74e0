#!/usr/bin/env bash
# Build the llama-cpp-python wheel pinned in requirements.txt with explicit CMake arguments, once,
# into a cache folder outside the repository keyed by the version and those arguments.
#
# Usage: scripts/build_llama_cpp_python.sh    prints the path of the wheel on its last line
#
#   LLMPOOL_LLAMA_NATIVE=1     opt in to a build for this machine's CPU (GGML_NATIVE=ON).  On an
#                              Intel CPU with AMX (Sapphire Rapids and later) that build compiles
#                              llama.cpp's AMX kernels, which segfault on the first request
#                              (llama.cpp issue #20824); use it only on a CPU without AMX.
#   LLMPOOL_LLAMA_CMAKE_ARGS   extra CMake arguments appended to the default ones (part of the key)
#   LLAMA_CPP_PYTHON_VERSION   the version (default: the requirements.txt pin, else the version in .venv)
#   LLMPOOL_BUILD_JOBS         parallel compile jobs (default: 2)
#
# The default build is portable: GGML_NATIVE=OFF, AVX/AVX2/FMA/F16C/BMI2 on, AVX-512 and AMX off,
# so the same wheel runs on any x86-64 CPU from Haswell on, and never runs the AMX kernels.
# pip caches wheels it built by name and version only, never by CMake arguments, so this script
# builds without pip's cache and keeps its own: ~/.cache/llmpool/wheels/<version>-<key>/.
# A natively built wheel from pip's cache can therefore never stand in for the portable one.
# About 5-8 minutes on 2 cores; nothing is rebuilt when the keyed folder holds the wheel.
set -euo pipefail
cd "$(dirname "$0")/.."

# shellcheck source=scripts/llama_cmake_args.sh
. scripts/llama_cmake_args.sh
if ! version=$(llama_cpp_python_version); then
  echo "build_llama_cpp_python: no llama-cpp-python version (pin it in requirements.txt or set LLAMA_CPP_PYTHON_VERSION)" >&2
  exit 2
fi
cmake_args=$(llama_cmake_args)
key=$(llama_build_key "$version" "$cmake_args")
cache="$HOME/.cache/llmpool"
target="$cache/wheels/llama_cpp_python-$version-$key"

existing=$(ls "$target"/llama_cpp_python-*.whl 2>/dev/null | head -n 1 || true)
if [ -n "$existing" ]; then
  echo "$existing"
  exit 0
fi

python=".venv/bin/python"
[ -x "$python" ] || python="${PYTHON:-python3}"
sdists="$cache/sdist"
sdist="$sdists/llama_cpp_python-$version.tar.gz"
mkdir -p "$sdists"
if [ ! -f "$sdist" ]; then
  "$python" -m pip download --quiet --disable-pip-version-check --no-binary :all: --no-deps \
    "llama-cpp-python==$version" -d "$sdists" >&2
fi

echo "build_llama_cpp_python: building llama-cpp-python $version with CMAKE_ARGS=$cmake_args" >&2
staging="$target.tmp.$$"
trap 'rm -rf "$staging"' EXIT
mkdir -p "$staging"
CMAKE_ARGS="$cmake_args" CMAKE_BUILD_PARALLEL_LEVEL="${LLMPOOL_BUILD_JOBS:-2}" \
  "$python" -m pip wheel --quiet --disable-pip-version-check --no-cache-dir --no-deps \
  "$sdist" -w "$staging" >&2
printf 'llama-cpp-python==%s\nCMAKE_ARGS=%s\nbuilt %s\n' "$version" "$cmake_args" \
  "$(date -u +%FT%TZ)" > "$staging/BUILD_INFO"

# Publish atomically: a concurrent or interrupted build never leaves a half-written wheel.
if ! mv -T "$staging" "$target" 2>/dev/null; then
  rm -rf "$staging"  # another build published first
fi
ls "$target"/llama_cpp_python-*.whl | head -n 1
