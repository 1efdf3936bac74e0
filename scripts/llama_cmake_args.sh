# The llama.cpp build flags, version and cache key llm-pool uses, shared by
# scripts/build_llama_cpp_python.sh and scripts/build_llama_server.sh (sourced, not run).
#
# Default (portable): no -march=native; AVX, AVX2, FMA, F16C and BMI2 on (any x86-64 CPU from
# Haswell/Zen on); AVX-512 and AMX off.  llama.cpp's AMX kernels segfault on the first request on
# Intel CPUs with AMX (llama.cpp issue #20824: the AMX tile-data permission is requested on the
# main thread only), and a native build compiles them on such a CPU.
# LLMPOOL_LLAMA_NATIVE=1: GGML_NATIVE=ON instead (the machine's own ISA, AMX included where the
# CPU has it).  LLMPOOL_LLAMA_CMAKE_ARGS: extra arguments appended to either.
llama_cmake_args() {
  local args
  if [ "${LLMPOOL_LLAMA_NATIVE:-0}" = 1 ]; then
    args="-DGGML_NATIVE=ON"
  else
    case "$(uname -m)" in
      x86_64|amd64)
        args="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON"
        args="$args -DGGML_BMI2=ON -DGGML_AVX512=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF"
        args="$args -DGGML_AMX_BF16=OFF"
        ;;
      *)
        args="-DGGML_NATIVE=OFF"
        ;;
    esac
  fi
  if [ -n "${LLMPOOL_LLAMA_CMAKE_ARGS:-}" ]; then
    args="$args $LLMPOOL_LLAMA_CMAKE_ARGS"
  fi
  printf '%s' "$args"
}

# The llama-cpp-python version both builds use: LLAMA_CPP_PYTHON_VERSION, else the requirements.txt
# pin, else the version installed in .venv.  Prints nothing and fails when there is none.
llama_cpp_python_version() {
  local version="${LLAMA_CPP_PYTHON_VERSION:-}"
  if [ -z "$version" ]; then
    version=$(sed -n 's/^llama-cpp-python==\([^ ;#]*\).*/\1/p' requirements.txt | head -n 1)
  fi
  if [ -z "$version" ] && [ -x .venv/bin/python ]; then
    version=$(.venv/bin/python -c 'import importlib.metadata as m; print(m.version("llama_cpp_python"))' 2>/dev/null || true)
  fi
  [ -n "$version" ] && printf '%s' "$version"
}

# A build's cache key: a hash of the version ($1) and the CMake arguments ($2).
llama_build_key() {
  printf '%s\n%s\n' "$1" "$2" | sha256sum | cut -c1-16
}
