"""GPU memory probe, behind one function.

The NVML probe (nvidia-ml-py) lands with a later issue; until then this module
reports that no GPU is visible so the API answers ``gpus: []`` with a reason.
"""
from __future__ import annotations


def probe_gpus() -> tuple[list[dict], str | None]:
    """([{index, name, used_mib, total_mib, used_over_total}], error or None)."""
    try:
        import pynvml
    except ImportError:
        return [], "nvidia-ml-py is not installed"
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        return [], f"NVML is unavailable: {exc}"
    try:
        gpus = []
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
            name = pynvml.nvmlDeviceGetName(handle)
            used, total = memory.used // (1024 * 1024), memory.total // (1024 * 1024)
            gpus.append(
                {
                    "index": index,
                    "name": name.decode() if isinstance(name, bytes) else name,
                    "used_mib": used,
                    "total_mib": total,
                    "used_over_total": f"{used}MiB / {total}MiB",
                }
            )
        return gpus, None if gpus else "no GPU is visible to NVML"
    except pynvml.NVMLError as exc:
        return [], f"NVML query failed: {exc}"
    finally:
        pynvml.nvmlShutdown()
