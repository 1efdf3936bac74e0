"""What the workbench's memory views draw: each GPU's used share, each device's budget as a bar
of its models' charges (the GPU page), and a load's memory plan over those
bars (the dry run the Load form shows before the operator confirms)."""
from __future__ import annotations


def load_plan_context(plan: dict, devices: list[dict]) -> dict:
    """What the plan template shows: the verdict and the bars of the devices the load would use."""
    needed = plan.get("needed") or ({plan["device"]: plan["needed_mib"]} if plan.get("device") else {})
    placement = plan.get("placement") or list(needed)
    bars = [bar for bar in device_bars(devices, needed) if bar["device"] in placement]
    action = plan.get("action")
    if action == "none":
        verdict = "already"
    elif action == "refuse" and any(b.get("name") for b in plan.get("blocking") or []):
        verdict = "blocked"
    else:
        verdict = {"load": "fits", "evict": "evict", "wait": "wait"}.get(action, "no_fit")
    return {"verdict": verdict, "plan_bars": bars}


def gpu_bars(gpus: list[dict]) -> list[dict]:
    """Each GPU with the used share of its memory in percent (the bar's width)."""
    return [
        {**gpu, "percent": round(100 * gpu["used_mib"] / gpu["total_mib"], 1) if gpu["total_mib"] else 0.0}
        for gpu in gpus
    ]


def device_bars(devices: list[dict], needed: dict[str, int] | None = None) -> list[dict]:
    """Each device of the pool's memory report as a bar: one segment per model's charge
    (measured, else reserved while it loads), then free; widths in percent of the budget (of
    the charges when they exceed it).  ``needed`` (a dry run's MiB per device) marks how much of
    the bar the load would take."""
    bars = []
    for device in devices:
        budget = device["budget_mib"] or 0
        charged = sum(charge["mib"] for charge in device.get("charges", []))
        scale = max(budget, charged) or 1
        segments = [
            {**charge, "percent": round(100 * charge["mib"] / scale, 1)}
            for charge in sorted(device.get("charges", []), key=lambda c: (c["kind"] != "measured", c["name"]))
        ]
        free = max(0, device["free_mib"])
        bar = {**device, "segments": segments, "free_percent": round(100 * free / scale, 1)}
        if needed is not None and device["device"] in needed:
            bar["needed_mib"] = needed[device["device"]]
            bar["needed_percent"] = round(min(100.0, 100 * bar["needed_mib"] / scale), 1)
            bar["fits"] = bar["needed_mib"] <= device["free_mib"]
        bars.append(bar)
    return bars
