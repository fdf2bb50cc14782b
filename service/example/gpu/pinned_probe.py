"""What the kernel reports for pinned host memory (`cuMemHostAlloc` pages).

    python -m service.example.gpu.pinned_probe [--mib 256]

Creates a CUDA context, reads its own memory counters, allocates ``--mib`` of pinned host
memory with `cuMemHostAlloc` (every byte written), reads them again, and prints one JSON
object: per source the counters before, after and the difference, in KiB:

- ``status``: /proc/self/status (VmRSS, RssAnon, RssFile, RssShmem, VmPin, VmLck, VmSize);
- ``smaps_rollup``: /proc/self/smaps_rollup (Rss, Pss, Shared_*, Private_*, Anonymous, Locked);
- ``psutil``: what the sampler records, ``memory_info()`` rss and shared, anon = rss - shared;
- ``mappings``: the mappings whose Size or Rss changed, by backing file ("[anon]" for none),
  from /proc/self/smaps: where the driver put the pages (a /dev/nvidia* mapping counts
  toward RSS only when the driver maps real pages into it).

The driver library is chosen as for the repro (``$LEAKBISECT_CUDA_LIBRARY``, default
``libcuda.so.1``). Exit status: 0, 125 without a CUDA driver, 1 when a CUDA call fails.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import psutil

from service.example.gpu.repro import Cuda, MiB, with_cuda

STATUS_FIELDS = ("VmRSS", "RssAnon", "RssFile", "RssShmem", "VmPin", "VmLck", "VmSize")
ROLLUP_FIELDS = (
    "Rss", "Pss", "Shared_Clean", "Shared_Dirty", "Private_Clean", "Private_Dirty",
    "Anonymous", "Locked",
)  # fmt: skip


def read_kib(path: Path, fields: tuple[str, ...]) -> dict[str, int]:
    """``Field:   N kB`` lines of a /proc file, for the fields asked (absent ones left out)."""
    out: dict[str, int] = {}
    try:
        text = path.read_text()
    except OSError:
        return out
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        if key in fields and rest.split():
            out[key] = int(rest.split()[0])
    return out


def mappings(smaps: Path = Path("/proc/self/smaps")) -> dict[str, dict[str, int]]:
    """Size and Rss (KiB) summed per backing file of every mapping ("[anon]": none)."""
    out: dict[str, dict[str, int]] = {}
    current = None
    for line in smaps.read_text().splitlines():
        parts = line.split()
        if parts and "-" in parts[0] and not parts[0].endswith(":"):
            backing = parts[5] if len(parts) > 5 else "[anon]"
            current = out.setdefault(backing, {"Size": 0, "Rss": 0})
        elif current is not None and parts and parts[0] in ("Size:", "Rss:"):
            current[parts[0][:-1]] += int(parts[1])
    return out


def _psutil_kib() -> dict[str, int]:
    mi = psutil.Process().memory_info()
    shared = getattr(mi, "shared", 0)
    return {"rss": mi.rss // 1024, "shared": shared // 1024, "anon": (mi.rss - shared) // 1024}


def _snapshot() -> dict[str, Any]:
    return {
        "status": read_kib(Path("/proc/self/status"), STATUS_FIELDS),
        "smaps_rollup": read_kib(Path("/proc/self/smaps_rollup"), ROLLUP_FIELDS),
        "psutil": _psutil_kib(),
        "mappings": mappings(),
    }


def _diff(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    return {k: after.get(k, 0) - before.get(k, 0) for k in after}


def probe(cuda: Cuda, mib: int) -> dict[str, Any]:
    """Counters before and after `mib` MiB of pinned host memory, with the differences."""
    dev = cuda.init()
    name, _total = cuda.describe(dev)
    ctx = cuda.create_context(dev)
    before = _snapshot()
    ptr = cuda.host_alloc(mib * MiB)
    after = _snapshot()
    cuda.free_host(ptr)
    cuda.destroy_context(ctx)
    report: dict[str, Any] = {"device": name, "library": cuda.library, "pinned_mib": mib}
    for source in ("status", "smaps_rollup", "psutil"):
        report[source] = {
            "before": before[source],
            "after": after[source],
            "delta": _diff(before[source], after[source]),
        }
    changed = {}
    for path, now in after["mappings"].items():
        was = before["mappings"].get(path, {"Size": 0, "Rss": 0})
        delta = _diff(was, now)
        if any(delta.values()):
            changed[path] = delta
    report["mappings"] = changed
    return report


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m service.example.gpu.pinned_probe")
    ap.add_argument("--mib", type=int, default=256, help="pinned host memory to allocate")
    args = ap.parse_args(argv)
    if args.mib <= 0:
        ap.error(f"--mib: {args.mib} is not a positive number of MiB")
    return with_cuda(lambda cuda: print(json.dumps(probe(cuda, args.mib), sort_keys=True)))


if __name__ == "__main__":
    sys.exit(main())
