"""The installed llama.cpp is the portable build: AVX2, no AMX kernels, whatever this CPU has.

pip's native build compiles llama.cpp's AMX kernels on an Intel CPU with AMX, and they segfault
on the first request there (docs/backends/llama_cpp.md, "The native build").  Reading the
library's own system info catches a regression on any host, AMX or not.
"""
import os
import platform
import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(
    os.environ.get("LLMPOOL_LLAMA_NATIVE") == "1" or bool(os.environ.get("LLMPOOL_LLAMA_CMAKE_ARGS")),
    reason="an operator's own llama.cpp build flags are in force",
)


def system_info() -> dict[str, str]:
    """``llama_print_system_info()`` as {feature: value}, read in a child process."""
    code = "import llama_cpp; print(llama_cpp.llama_print_system_info().decode())"
    text = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True).stdout
    features = {}
    for part in text.replace("\n", "|").split("|"):
        name, sep, value = part.rpartition("=")
        if sep:
            features[name.split(":")[-1].strip()] = value.strip()
    return features


@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="x86-64 ISA flags")
def test_the_default_build_has_no_amx_and_keeps_avx2():
    features = system_info()
    assert features.get("AVX2") == "1", features
    assert features.get("FMA") == "1" and features.get("F16C") == "1", features
    assert not [name for name in features if name.startswith("AMX")], features
    assert "AVX512" not in features, features
