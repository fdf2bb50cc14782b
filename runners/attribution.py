"""Which allocation site: the stacks whose live memory grows in the first bad release only.

Pure: two profiles in (as `runners/tracehelper.py` writes them), one finding out.

Rules, in code order:

1. A stack's growth in one profile is its live bytes at the last snapshot minus those at
   the snapshot a third of the way in (`WARMUP_FRACTION`: caches fill and imports land
   early, as the classifier's floors skip warm-up). A profile with one snapshot (memray:
   live at the end) grows by all of it. `grew_in` is the fraction of the intervals after
   warm-up in which the stack grew: a leak grows in nearly every one, a spike in one.
2. Stacks match across the two releases by their frames (file relative to site-packages,
   line, function). A stack counts when it grows by `MIN_GROWTH_BYTES` or more in the
   first bad release and by less than half as much in the last good one.
3. The counted stacks are listed largest growth first, `top` of them. Each names its site:
   the innermost frame in the bisected package when the stack passes through it (marked
   ``in_package``), else the innermost frame.
4. tracemalloc sees only allocations made through Python's allocators. When the first bad
   run's RSS grew and the counted stacks explain less than `NATIVE_SHARE` of it, the
   finding says the rest is "native, not visible to tracemalloc".
"""

from __future__ import annotations

from typing import Any

from packaging.utils import canonicalize_name

MIB = 1024 * 1024
WARMUP_FRACTION = 1 / 3
MIN_GROWTH_BYTES = 256 * 1024
NATIVE_SHARE = 0.25
NATIVE_NOTE = "native, not visible to tracemalloc"

Key = tuple[tuple[str, int, str], ...]


def growth(profile: dict[str, Any]) -> dict[Key, tuple[int, float | None]]:
    """Per stack: (bytes grown after warm-up, fraction of intervals it grew in)."""
    out: dict[Key, tuple[int, float | None]] = {}
    for stack in profile.get("stacks") or []:
        key = tuple((str(f), int(n), str(fn)) for f, n, fn in stack["frames"])
        sizes = [int(s) for s in stack["sizes"]]
        if len(sizes) < 2:
            out[key] = (sizes[-1] if sizes else 0, None)
            continue
        start = int((len(sizes) - 1) * WARMUP_FRACTION)
        late = sizes[start:]
        steps = list(zip(late, late[1:], strict=False))
        grew = sum(b > a for a, b in steps) / len(steps) if steps else None
        out[key] = (late[-1] - late[0], grew)
    return out


def _modules(package: str) -> set[str]:
    """The import names a distribution is likely to have (orbax-checkpoint: orbax...)."""
    name = canonicalize_name(package)
    return {name.replace("-", "_"), name.split("-")[0]}


def _in_package(file: str, modules: set[str]) -> bool:
    return file.replace("\\", "/").split("/")[0] in modules


def _frame(frame: tuple[str, int, str]) -> str:
    file, line, function = frame
    return f"{file}:{line} in {function}" if line else f"{file} in {function}"


def _stack(key: Key, grown: int, grew: float | None, good: int, modules: set[str]) -> dict:
    inner_first = list(reversed(key))
    mine = [f for f in inner_first if _in_package(f[0], modules)]
    site = (mine or inner_first or [("?", 0, "?")])[0]
    return {
        "site": _frame(site),
        "in_package": bool(mine),
        "growth_bytes": grown,
        "good_growth_bytes": good,
        "grew_in": None if grew is None else round(grew, 2),
        "frames": [_frame(f) for f in inner_first],
    }


def unavailable(tracer: str, note: str) -> dict[str, Any]:
    return {"tracer": tracer, "available": False, "note": note, "stacks": []}


def compare(
    good: dict[str, Any] | None,
    bad: dict[str, Any] | None,
    package: str,
    *,
    tracer: str,
    top: int = 10,
    rss_growth_bytes: float | None = None,
) -> dict[str, Any]:
    """The finding of one tracer (see the module docstring); `good`/`bad`: the profiles."""
    for profile in (bad, good):
        if not profile or profile.get("error"):
            why = (profile or {}).get("error") or "the traced run wrote no profile"
            return unavailable(tracer, why)
    assert good is not None and bad is not None
    before, after = growth(good), growth(bad)
    modules = _modules(package)
    stacks = [
        _stack(key, grown, grew, before.get(key, (0, None))[0], modules)
        for key, (grown, grew) in after.items()
        if grown >= MIN_GROWTH_BYTES and before.get(key, (0, None))[0] < grown / 2
    ]
    stacks.sort(key=lambda s: s["growth_bytes"], reverse=True)
    note = None
    explained = sum(s["growth_bytes"] for s in stacks)
    if (tracer == "tracemalloc" and rss_growth_bytes and rss_growth_bytes >= MIN_GROWTH_BYTES
            and explained < NATIVE_SHARE * rss_growth_bytes):  # fmt: skip
        note = (f"{NATIVE_NOTE}: the stacks explain {explained / MIB:.1f} MiB of "
                f"{rss_growth_bytes / MIB:.1f} MiB of RSS growth")  # fmt: skip
    elif not stacks:
        note = "no stack grows in the first bad release and not in the last good one"
    return {"tracer": tracer, "available": True, "note": note, "stacks": stacks[:top]}


def headline(finding: dict[str, Any]) -> str | None:
    """One line for the job's message: the top site, or the note."""
    stacks = finding.get("stacks") or []
    if stacks:
        top = stacks[0]
        return f"grows at {top['site']} (+{top['growth_bytes'] / MIB:.1f} MiB, {finding['tracer']})"
    return None
