#!/usr/bin/env bash
# The GPU check: llm-pool on a real GPU, in one prepared run (docs/gpu.md).
#
#   scripts/gpu_check.sh prepare   here, with network: download into .whl/ the wheels llm-pool needs
#                                  beyond what the GPU machine's image has (Python 3.12, x86-64)
#   scripts/gpu_check.sh run       on the GPU machine (the device tool's run, carry [".whl"]):
#                                  install them, start `manage.py serve`, and report
#                                  1. GET /v1/admin/gpu-memory next to nvidia-smi's own reading,
#                                  2. the observed_load_delta of a stub model whose replicas each
#                                     allocate GPU_CHECK_ALLOC_MIB with torch (the estimate must come
#                                     out within GPU_CHECK_TOLERANCE_MIB of replicas x that), kept
#                                     with its replica count after the unload, and the memory back.
#
# The report is printed and written to $OUT/gpu_check.json (or ./gpu_check.json); the exit status
# is 0 only when every check passed.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"  # on the GPU machine, python3 is the one with PyTorch

# What `manage.py serve` imports for stub models; the GPU image already has torch, numpy, httpx,
# Jinja2, prometheus-client, nvidia-ml-py and the other shared dependencies.
SERVE_PACKAGES='Django|channels|daphne|uvicorn|uvloop|httptools|websockets|aiohttp|orjson|djangorestframework|adrf|drf-spectacular|drf-spectacular-sidecar|pydantic|channels-redis|dj-database-url|psycopg\[binary\]|gguf'
ON_THE_IMAGE='numpy|pyyaml|tqdm|msgpack|idna|certifi|attrs|packaging|requests|urllib3|charset_normalizer|typing_extensions'

prepare() {
  local exclude
  exclude="$(git rev-parse --git-path info/exclude)"
  mkdir -p "$(dirname "$exclude")"
  grep -qsx '/.whl/' "$exclude" || echo '/.whl/' >> "$exclude"
  rm -rf .whl && mkdir .whl
  local requirements
  requirements=$(mktemp)
  grep -iE "^(${SERVE_PACKAGES})==" requirements.txt > "$requirements"
  "$PYTHON" -m pip download --quiet --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d .whl -r "$requirements"
  rm -f "$requirements"
  find .whl -maxdepth 1 -regextype posix-extended -iregex ".*/(${ON_THE_IMAGE})-[^/]*\.whl" -delete
  du -sh .whl
}

run() {
  local site=/tmp/llmpool-site
  if [ -d .whl ]; then  # without carried wheels, the current environment must have llm-pool's packages
    "$PYTHON" -m pip install --quiet --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" .whl/*.whl
    export PYTHONPATH="$site"
  fi
  export PYTHONUNBUFFERED=1 GPU_CHECK_REPORT="${OUT:-.}/gpu_check.json"
  "$PYTHON" - <<'PYTHON'
import json, os, signal, socket, subprocess, sys, tempfile, time
import httpx

alloc_mib = int(os.environ.get("GPU_CHECK_ALLOC_MIB", "2048"))
replicas = int(os.environ.get("GPU_CHECK_REPLICAS", "2"))
tolerance_mib = int(os.environ.get("GPU_CHECK_TOLERANCE_MIB", "64"))
report = {"checks": {}, "alloc_mib": alloc_mib, "replicas": replicas, "tolerance_mib": tolerance_mib}

def nvidia_smi():
    out = subprocess.run(["nvidia-smi", "--query-gpu=index,name,memory.used,memory.total",
                          "--format=csv,noheader,nounits"], capture_output=True, text=True, check=True).stdout
    return [line.strip() for line in out.splitlines() if line.strip()]

def check(name, ok, detail):
    report["checks"][name] = {"ok": bool(ok), "detail": detail}

sys.path.insert(0, os.getcwd())
from runtime.backends.stub import StubDefinition
stub_allocates = "stub_gpu_alloc_mib" in StubDefinition.model_fields

folder = tempfile.mkdtemp(prefix="gpu-check-")
models = {"idle": {"backend": "stub"}}
if stub_allocates:
    # "context" makes the runtime process create its CUDA context, so "probe" measures its blocks alone.
    models["context"] = {"backend": "stub", "stub_gpu_alloc_mib": 2}
    models["probe"] = {"backend": "stub", "stub_gpu_alloc_mib": alloc_mib, "replicas": replicas, "replica_max": replicas}
with open(os.path.join(folder, "settings.json"), "w") as handle:
    json.dump({"models": models}, handle)
with socket.socket() as sock:
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
env = {**os.environ, "LLMPOOL_SETTINGS": os.path.join(folder, "settings.json"),
       "LLMPOOL_DB_PATH": os.path.join(folder, "db.sqlite3")}
log = open(os.path.join(folder, "serve.log"), "wb")
serve = subprocess.Popen([sys.executable, "manage.py", "serve", "--port", str(port)], env=env,
                         stdout=log, stderr=subprocess.STDOUT)
base = f"http://127.0.0.1:{port}"
try:
    deadline = time.monotonic() + 60
    while True:
        if serve.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError("serve did not start:\n" + open(log.name, errors="replace").read()[-4000:])
        try:
            if httpx.get(base + "/healthz", timeout=1).status_code == 200:
                break
        except httpx.HTTPError:
            time.sleep(0.2)
    http = httpx.Client(base_url=base, timeout=300)

    memory = http.get("/v1/admin/gpu-memory").json()
    report["gpu_memory"] = memory
    report["nvidia_smi"] = nvidia_smi()
    check("gpu_memory_lists_the_gpus", memory["gpus"] and memory["error"] is None,
          [gpu["used_over_total"] for gpu in memory["gpus"]])
    check("total_matches_nvidia_smi",
          [gpu["total_mib"] for gpu in memory["gpus"]] == [int(line.split(",")[-1]) for line in report["nvidia_smi"]],
          report["nvidia_smi"])

    if not stub_allocates:
        check("observed_load_delta", False, "SKIPPED: the stub backend has no stub_gpu_alloc_mib field (docs/gpu.md)")
    else:
        def entry(name):
            return next(m for m in http.get("/v1/admin/gpu-memory").json()["models"] if m["name"] == name)
        loaded = http.post("/v1/admin/models/context/load").json()
        report["context_load"] = {k: loaded[k] for k in ("runtime_state", "last_error", "vram_estimate_mib")}
        used_before = sum(g["used_mib"] for g in http.get("/v1/admin/gpu-memory").json()["gpus"])
        loaded = http.post("/v1/admin/models/probe/load").json()
        probe = entry("probe")
        report["probe_loaded"] = probe
        expected = alloc_mib * replicas
        check("probe_loaded", loaded["runtime_state"] == "loaded", loaded["last_error"])
        check("observed_load_delta_near_allocation",
              probe["vram_estimate_source"] == "observed_load_delta"
              and probe["vram_estimate_replica_count"] == replicas
              and abs(probe["vram_estimate_mib"] - expected) <= tolerance_mib,
              {"observed_mib": probe["vram_estimate_mib"], "expected_mib": expected})
        http.post("/v1/admin/models/probe/unload")
        kept = entry("probe")
        report["probe_unloaded"] = kept
        check("estimate_kept_after_unload",
              (kept["vram_estimate_mib"], kept["vram_estimate_replica_count"], kept["vram_estimate_source"])
              == (probe["vram_estimate_mib"], replicas, "observed_load_delta"), kept)
        used_after = sum(g["used_mib"] for g in http.get("/v1/admin/gpu-memory").json()["gpus"])
        check("memory_back_after_unload", abs(used_after - used_before) <= tolerance_mib,
              {"used_before_probe_mib": used_before, "used_after_unload_mib": used_after})
finally:
    serve.send_signal(signal.SIGTERM)
    try:
        serve.wait(timeout=30)
    except subprocess.TimeoutExpired:
        serve.kill()
    report["serve_exit"] = serve.returncode
    report["passed"] = bool(report["checks"]) and all(c["ok"] for c in report["checks"].values())
    text = json.dumps(report, indent=2)
    print(text)
    with open(os.environ["GPU_CHECK_REPORT"], "w") as handle:
        handle.write(text)
sys.exit(0 if report["passed"] else 1)
PYTHON
}

case "${1:-}" in
  prepare) prepare ;;
  run) run ;;
  *) echo "usage: scripts/gpu_check.sh prepare|run" >&2; exit 2 ;;
esac
