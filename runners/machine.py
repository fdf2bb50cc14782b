"""What the machine running the trials is: reported with every result."""

import os
import platform
from typing import Any

import psutil

from runners.nvml import GpuProbe


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def describe_machine(gpu: GpuProbe | None = None) -> dict[str, Any]:
    info: dict[str, Any] = {
        "hostname": platform.node(),
        "python": platform.python_version(),
        "os": f"{platform.system()} {platform.release()}",
        "platform": platform.platform(),
        "cpu": _cpu_model(),
        "cpus": os.cpu_count(),
        "memory_bytes": psutil.virtual_memory().total,
        "gpu": None,
    }
    probe = gpu if gpu is not None else GpuProbe.open()
    if probe is not None:
        info["gpu"] = probe.describe()
    return info
