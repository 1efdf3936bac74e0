#!/usr/bin/env bash
# Build llama-server once from the llama.cpp sources vendored in the llama-cpp-python sdist
# pinned in requirements.txt, into a cache folder outside the repository.
#
# Usage: scripts/build_llama_server.sh        prints the path of the binary on its last line
#
#   LLAMA_CPP_PYTHON_VERSION  the sdist version (default: the requirements.txt pin, else the
#                             version installed in .venv)
#   LLMPOOL_LLAMA_SERVER_DIR  the cache folder (default: ~/.cache/llmpool/llama-server-<version>-<key>,
#                             the key a hash of the version and the CMake ISA arguments)
#   LLMPOOL_LLAMA_NATIVE=1    a native build instead of the portable one (see scripts/llama_cmake_args.sh)
#   LLMPOOL_LLAMA_CMAKE_ARGS  extra CMake arguments (part of the key)
#   LLMPOOL_BUILD_JOBS        parallel compile jobs (default: 2)
#
# Nothing is rebuilt when the folder already holds bin/llama-server.  The binary is linked
# statically (BUILD_SHARED_LIBS=OFF) and CPU-only with the ISA flags llama-cpp-python is built
# with (scripts/llama_cmake_args.sh: AVX2/FMA/F16C, no AVX-512, no AMX), so it runs on any
# x86-64 machine from Haswell on that the cache is copied to.  About 5-10 minutes on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/.."

# shellcheck source=scripts/llama_cmake_args.sh
. scripts/llama_cmake_args.sh
if ! version=$(llama_cpp_python_version); then
  echo "build_llama_server: no llama-cpp-python version (pin it in requirements.txt or set LLAMA_CPP_PYTHON_VERSION)" >&2
  exit 2
fi
isa_args=$(llama_cmake_args)
key=$(llama_build_key "$version" "$isa_args")
target="${LLMPOOL_LLAMA_SERVER_DIR:-$HOME/.cache/llmpool/llama-server-$version-$key}"
binary="$target/bin/llama-server"
if [ -x "$binary" ]; then
  echo "$binary"
  exit 0
fi

pip="${PIP:-.venv/bin/python -m pip}"
[ -x .venv/bin/python ] || pip="python3 -m pip"
sdists="$HOME/.cache/llmpool/sdist"
sdist="$sdists/llama_cpp_python-$version.tar.gz"
mkdir -p "$sdists"
if [ ! -f "$sdist" ]; then
  $pip download --quiet --disable-pip-version-check --no-binary :all: --no-deps \
    "llama-cpp-python==$version" -d "$sdists" >&2
fi

work=$(mktemp -d "${TMPDIR:-/tmp}/llama-server-build.XXXXXX")
trap 'rm -rf "$work"' EXIT
tar -xzf "$sdist" -C "$work"
source_dir="$work/llama_cpp_python-$version/vendor/llama.cpp"

cmake -S "$source_dir" -B "$work/build" -G "Unix Makefiles" \
  -DCMAKE_BUILD_TYPE=Release \
  -DBUILD_SHARED_LIBS=OFF \
  -DLLAMA_BUILD_TESTS=OFF \
  -DLLAMA_BUILD_EXAMPLES=OFF \
  -DLLAMA_BUILD_SERVER=ON \
  -DLLAMA_BUILD_UI=OFF \
  -DLLAMA_USE_PREBUILT_UI=OFF \
  -DLLAMA_OPENSSL=OFF $isa_args >&2
cmake --build "$work/build" --target llama-server -j "${LLMPOOL_BUILD_JOBS:-2}" >&2

# Publish atomically: a concurrent or interrupted build never leaves a half-written binary.
staging="$target.tmp.$$"
mkdir -p "$staging/bin"
cp "$work/build/bin/llama-server" "$staging/bin/llama-server"
echo "llama-cpp-python==$version $isa_args $(date -u +%FT%TZ)" > "$staging/BUILD_INFO"
mkdir -p "$(dirname "$target")"
if ! mv -T "$staging" "$target" 2>/dev/null; then
  rm -rf "$staging"  # another build published first
fi
echo "$binary"
