"""GPU memory, read from NVML (nvidia-ml-py), else from ``nvidia-smi --query-gpu``.

``probe_gpus`` answers GET /v1/admin/gpu-memory: every visible GPU with
``used_over_total`` in nvidia-smi's compact ``"75603MiB / 97887MiB"`` form, or
``[]`` and the reason when neither NVML nor nvidia-smi can be read.
``used_memory_mib`` and ``load_delta`` measure what a model load took
(``observed_load_delta``): the used memory of all GPUs before and after loading
every replica.  The delta also counts memory other processes took meanwhile,
so it is an estimate, as the admin API calls it.

Every function here blocks (NVML calls, a subprocess with a timeout): callers
on the event loop run them with ``asyncio.to_thread``.
"""
from __future__ import annotations

import logging
import shutil
import subprocess

NVIDIA_SMI_QUERY = [
    "nvidia-smi",
    "--query-gpu=index,name,memory.used,memory.total",
    "--format=csv,noheader,nounits",
]
NVIDIA_SMI_TIMEOUT_SECONDS = 10.0
MIB = 1024 * 1024

logger = logging.getLogger("llmpool.runtime")


def gpu_entry(index: int, name: str, used_mib: int, total_mib: int) -> dict:
    return {
        "index": index,
        "name": name,
        "used_mib": used_mib,
        "total_mib": total_mib,
        "used_over_total": f"{used_mib}MiB / {total_mib}MiB",
    }


def probe_gpus() -> tuple[list[dict], str | None]:
    """([{index, name, used_mib, total_mib, used_over_total}], error or None)."""
    gpus, nvml_error = probe_nvml()
    if gpus:
        return gpus, None
    gpus, smi_error = probe_nvidia_smi()
    if gpus:
        return gpus, None
    return [], f"{nvml_error}; {smi_error}"


def probe_nvml() -> tuple[list[dict], str | None]:
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
            name = name.decode() if isinstance(name, bytes) else name
            gpus.append(gpu_entry(index, name, memory.used // MIB, memory.total // MIB))
        return gpus, None if gpus else "no GPU is visible to NVML"
    except pynvml.NVMLError as exc:
        return [], f"NVML query failed: {exc}"
    finally:
        pynvml.nvmlShutdown()


def probe_nvidia_smi() -> tuple[list[dict], str | None]:
    # Looked up first: a failed spawn forks the whole process, which in a serving process with
    # a model loaded costs more than everything else a model load adds to the engine's own time.
    binary = shutil.which(NVIDIA_SMI_QUERY[0])
    if binary is None:
        return [], "nvidia-smi is not on PATH"
    try:
        completed = subprocess.run(
            [binary, *NVIDIA_SMI_QUERY[1:]], capture_output=True, text=True, timeout=NVIDIA_SMI_TIMEOUT_SECONDS,
            check=False,
        )
    except FileNotFoundError:
        return [], "nvidia-smi is not on PATH"
    except subprocess.TimeoutExpired:
        return [], f"nvidia-smi did not answer within {NVIDIA_SMI_TIMEOUT_SECONDS:g} s"
    except OSError as exc:
        return [], f"nvidia-smi cannot run: {exc}"
    if completed.returncode != 0:
        detail = (completed.stderr or completed.stdout).strip().splitlines()
        return [], f"nvidia-smi failed (exit {completed.returncode}): {detail[0] if detail else 'no output'}"
    try:
        gpus = [_parse_smi_line(line) for line in completed.stdout.splitlines() if line.strip()]
    except ValueError as exc:
        return [], f"nvidia-smi gave an unreadable answer: {exc}"
    return gpus, None if gpus else "no GPU is visible to nvidia-smi"


def _parse_smi_line(line: str) -> dict:
    """``"0, NVIDIA H200, 1234, 143771"`` (the name may itself hold commas)."""
    fields = [field.strip() for field in line.split(",")]
    if len(fields) < 4:
        raise ValueError(f"expected index, name, used, total in {line!r}")
    index, name, used, total = fields[0], ", ".join(fields[1:-2]), fields[-2], fields[-1]
    try:
        return gpu_entry(int(index), name, int(used), int(total))
    except ValueError:
        raise ValueError(f"not numbers in {line!r}") from None


def process_gpu_memory_bytes(pid: int) -> int | None:
    """The device memory process ``pid`` holds on every GPU together (NVML's compute and
    graphics process lists), 0 when it holds none, or None when NVML cannot be read (no GPU,
    no driver, or a driver that hides per-process figures).  Never raises."""
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return None
    try:
        count, total = pynvml.nvmlDeviceGetCount(), 0
        for index in range(count):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            for listing in (pynvml.nvmlDeviceGetComputeRunningProcesses, pynvml.nvmlDeviceGetGraphicsRunningProcesses):
                for process in listing(handle):
                    if process.pid == pid and isinstance(process.usedGpuMemory, int):
                        total += process.usedGpuMemory
        return total if count else None
    except pynvml.NVMLError:
        return None
    finally:
        try:
            pynvml.nvmlShutdown()
        except pynvml.NVMLError:
            pass


def used_memory_mib() -> int | None:
    """Used memory of all visible GPUs together, or None when no GPU can be read.

    Never raises: it only measures, and a measurement must not fail a model load.
    """
    try:
        gpus, _error = probe_gpus()
    except Exception:
        logger.exception("reading the GPU memory failed")
        return None
    return sum(gpu["used_mib"] for gpu in gpus) if gpus else None


def load_delta(before_mib: int | None, after_mib: int | None) -> int | None:
    """What a load took, in MiB: None when either reading is missing, never below 0."""
    if before_mib is None or after_mib is None:
        return None
    return max(0, after_mib - before_mib)
