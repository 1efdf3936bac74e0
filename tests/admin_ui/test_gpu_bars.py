"""The GPU page's bars, rendered from a gpu-memory answer with GPUs in it (CI machines have none)."""
from __future__ import annotations

from django.template.loader import render_to_string

from models_app.workbench.memory_bars import gpu_bars

MEMORY = {
    "gpus": [
        {"index": 0, "name": "NVIDIA H200", "used_mib": 75603, "total_mib": 97887,
         "used_over_total": "75603MiB / 97887MiB"},
        {"index": 1, "name": "NVIDIA H200", "used_mib": 0, "total_mib": 0, "used_over_total": "0MiB / 0MiB"},
    ],
    "models": [
        {"name": "gemma", "runtime_state": "loaded", "is_loaded": True, "configured_target_inflight": 1,
         "effective_target_inflight": 1, "vram_estimate_mib": 12500, "vram_estimate_replica_count": 3,
         "vram_estimate_source": "observed_load_delta"},
    ],
    "error": None,
}


def test_bars_carry_the_used_share():
    bars = gpu_bars(MEMORY["gpus"])
    assert [bar["percent"] for bar in bars] == [77.2, 0.0]
    assert bars[0]["used_over_total"] == "75603MiB / 97887MiB"


def test_the_gpu_fragment_draws_one_bar_per_gpu_and_the_estimates():
    html = render_to_string("llmpool_admin/_gpu.html", {"memory": MEMORY, "gpus": gpu_bars(MEMORY["gpus"])})
    assert html.count('class="gpu-bar"') == 2
    assert 'style="width: 77.2%"' in html
    assert "75603MiB / 97887MiB" in html and "GPU 0: NVIDIA H200" in html
    assert 'aria-valuenow="75603"' in html and 'aria-valuemax="97887"' in html
    assert "12500 MiB" in html and "observed_load_delta" in html
    assert "data-gpu-error" not in html


def test_no_gpu_shows_why():
    memory = {"gpus": [], "models": [], "error": "NVML is unavailable: driver not loaded"}
    html = render_to_string("llmpool_admin/_gpu.html", {"memory": memory, "gpus": []})
    assert "gpu-bar" not in html
    assert "No GPU memory reading: NVML is unavailable: driver not loaded" in html
