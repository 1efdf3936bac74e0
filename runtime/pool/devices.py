"""The devices memory is budgeted on: every NVML GPU (``cuda:N``) and ``cpu``, found at start,
each with a ``budget_mib`` from ``memory.devices`` (null: the device's total minus its reserve);
a definition's ``device`` field; the environment a placement gives an engine."""
from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

MIB = 1024 * 1024
DEVICE_NAME = re.compile(r"^(cpu|cuda:[0-9]{1,3})$")
DEFAULT_RESERVE_MIB = {"cpu": 2048, "cuda": 1024}


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class DeviceBudget(_Strict):
    """``memory.devices.<name>``: null budget: the device's total minus the reserve."""

    budget_mib: int | None = Field(None, ge=0)
    reserve_mib: int | None = Field(None, ge=0)  # null: 1024 for a GPU, 2048 for cpu


class MemorySettings(_Strict):
    devices: dict[str, DeviceBudget] = Field(default_factory=dict)
    eviction: Literal["none", "idle_lru"] = "none"

    @field_validator("devices", mode="before")
    @classmethod
    def _device_names(cls, value):
        if isinstance(value, dict):
            for name in value:
                if not isinstance(name, str) or not DEVICE_NAME.match(name):
                    raise ValueError(f"device name {name!r} must be \"cpu\" or \"cuda:N\"")
        return value


def check_device_field(value: Any) -> Any:
    """A definition's ``device``: null, "auto", "cpu", "cuda:N", or a list of "cuda:N" (tensor
    parallel); raises ValueError otherwise."""
    if value is None or value == "auto":
        return value
    if isinstance(value, str):
        if not DEVICE_NAME.match(value):
            raise ValueError('device must be "auto", "cpu", "cuda:N" or a list of "cuda:N"')
        return value
    if isinstance(value, list) and value and all(isinstance(d, str) and d.startswith("cuda:") for d in value):
        if not all(DEVICE_NAME.match(d) for d in value) or len(set(value)) != len(value):
            raise ValueError('device lists name distinct GPUs as "cuda:N"')
        return value
    raise ValueError('device must be "auto", "cpu", "cuda:N" or a list of "cuda:N"')


def found_devices() -> dict[str, int]:
    """Every device this machine has, with its total MiB: each NVML GPU and ``cpu`` (psutil)."""
    import psutil

    from runtime import gpu

    gpus, _error = gpu.probe_nvml()
    devices = {f"cuda:{item['index']}": item["total_mib"] for item in gpus}
    devices["cpu"] = psutil.virtual_memory().total // MIB
    return devices


@dataclass
class Device:
    name: str
    total_mib: int | None  # None: configured but not found on this machine
    budget_mib: int

    def to_dict(self, used: int, reserved: int) -> dict:
        return {
            "device": self.name, "total_mib": self.total_mib, "budget_mib": self.budget_mib,
            "used_mib": used, "reserved_mib": reserved, "free_mib": self.budget_mib - used - reserved,
        }


def budgets(settings: MemorySettings, found: dict[str, int]) -> dict[str, Device]:
    devices = {}
    for name in sorted(set(found) | set(settings.devices), key=device_order):
        config = settings.devices.get(name, DeviceBudget())
        total = found.get(name)
        reserve = config.reserve_mib
        if reserve is None:
            reserve = DEFAULT_RESERVE_MIB["cpu" if name == "cpu" else "cuda"]
        budget = config.budget_mib if config.budget_mib is not None else max(0, (total or 0) - reserve)
        devices[name] = Device(name, total, budget)
    return devices


def device_order(name: str) -> tuple:
    return (0, 0) if name == "cpu" else (1, int(name.split(":")[1]))


def cuda_visible_devices(placement) -> str | None:
    """CUDA_VISIBLE_DEVICES for a load placed on ``placement`` (a list of devices, or None):
    the GPUs' indices ("1", "0,1"), or None on cpu or without a placement (the environment is
    left as it is)."""
    gpus = [device.split(":")[1] for device in placement or () if device.startswith("cuda:")]
    return ",".join(gpus) if gpus else None


def measure_process_memory() -> int:
    """This process's resident set size, MiB."""
    import psutil

    return psutil.Process(os.getpid()).memory_info().rss // MIB
