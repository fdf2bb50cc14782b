"""Which allocation site: the stacks whose live memory grows in the first bad release only,
and what the traced runs may cost.

Pure: two profiles in (as `runners/tracehelper.py` writes them), one finding out; the
numbers of the job's untraced runs in, one `TraceStop` out.

Rules, in code order:

1. The pair is compared over the same steps: a profile of several snapshots is cut at
   the last step marker the other one reached (every snapshot records the markers seen),
   since a run cut short by its budget stops at another step than its pair, and a spike
   live at one run's end and not at the other's would pass for growth.
2. A stack's growth in one profile is its live bytes at the last snapshot minus those at
   the snapshot a third of the way in (`WARMUP_FRACTION`: caches fill and imports land
   early, as the classifier's floors skip warm-up). A profile with one snapshot (memray:
   live at the end) grows by all of it. `grew_in` is the fraction of the intervals after
   warm-up in which the stack grew: a leak grows in nearly every one, a spike in one.
   With step markers the first bad release is judged on no step the last good one was
   not (`judged`): from the good run's first judged marker to its last, since snapshots
   fall where the timing puts them and a third of each run's can be different steps;
   where fewer than two of the bad run's snapshots lie in that window, from its last
   snapshot before it (the smallest window that can show growth at all).
3. Stacks match across the two releases by their frames (file relative to site-packages,
   line, function). A stack counts when it grows by `MIN_GROWTH_BYTES` or more in the
   first bad release and by less than half as much in the last good one.
4. The counted stacks are listed largest growth first, `top` of them. Each names its site:
   the innermost frame in the bisected package when the stack passes through it (marked
   ``in_package``), else the innermost frame.
5. tracemalloc sees only allocations made through Python's allocators. When the first bad
   run's RSS grew and the counted stacks explain less than `NATIVE_SHARE` of it, the
   finding says the rest is "native, not visible to tracemalloc".
6. The cheaper tracer goes first (`contract.wire.TRACERS`: memray, then tracemalloc).
   tracemalloc runs only when memray named no site (it did not install, wrote no
   profile, or no stack grew): memray's hybrid stacks hold the same Python frames
   tracemalloc records (file, line, function) and the native ones below them, and on
   every repro measured (docs/bench-stages.md) both named the same line, while a whole
   run took tracemalloc 4x to 30x an untraced one (the issue's msgpack-like case: 23x),
   and memray 1.2x to 3x.
7. A traced run stops once it has what the comparison needs (`trace_stop`): with step
   markers, after `markers_needed` of them. The bad release's growth over the steps
   that rule 2 judges must clear `CLEAR_FACTOR` x `MIN_GROWTH_BYTES`, so that a stack
   carrying a quarter of it (`NATIVE_SHARE`) still counts. A leak verdict means at least
   the job's `min_growth_mib` over its N steps, so J = N x CLEAR_FACTOR x
   MIN_GROWTH_BYTES / min_growth_mib judged steps suffice (N/8 with the defaults), and
   never fewer than `MIN_JUDGED_STEPS` (a spike then grows in one interval of eight, a
   leak that lands every few steps lands twice); rule 2 judges two thirds of the
   snapshots, so the markers needed are the fewest M with M - 1 - floor((M - 1) / 3)
   >= J. None (run to the end) when M is not below N. Without markers the helper cannot
   tell how far a script got: only the budget stops it.
8. And at its budget: at most `BUDGET_FACTOR` x the untraced run of the same candidate
   (memray's whole run fits, and its bounded one took under 1x; tracemalloc, 4x to 30x,
   is the tracer this cuts), and the stage at most `STAGE_SHARE` of the search's run
   seconds: a run gets the stage's budget left over the runs it may still take (both
   tracers on both releases, less those ended), but never less than `BUDGET_FLOOR` x its
   untraced run, so that a small search's share never cuts memray (a two-release search
   runs about four untraced runs: half of that over four traced runs is half an untraced
   run each). So the stage's runs take at most about max(STAGE_SHARE x search, 4 x
   BUDGET_FLOOR x untraced) and never more than 4 x BUDGET_FACTOR x untraced. The runner
   kills a traced run that outlives `hard_timeout` (the helper's stop did not land: a
   script stuck in native code); that run has no profile.
9. How each run of the pair ended (`stops`), from its profile: at its end, at "enough"
   markers, cut short by its "budget", or by a signal; a tracer with a run cut short by
   its budget says so (`cut_short`), as the reports show.
"""

from __future__ import annotations

import math
from typing import Any

from packaging.utils import canonicalize_name

from contract.wire import TRACERS, TraceStop

MIB = 1024 * 1024
WARMUP_FRACTION = 1 / 3
MIN_GROWTH_BYTES = 256 * 1024
NATIVE_SHARE = 0.25
NATIVE_NOTE = "native, not visible to tracemalloc"
CLEAR_FACTOR = 4  # 1 / NATIVE_SHARE: a stack with a quarter of the growth still counts
MIN_JUDGED_STEPS = 8
BUDGET_FACTOR = 3.0
BUDGET_FLOOR = 2.0
STAGE_SHARE = 0.5
PLANNED_RUNS = 2 * len(TRACERS)  # each tracer on each release of the pair
SKIPPED_NOTE = "not run: memray named the site (tracemalloc runs only when memray cannot)"

Key = tuple[tuple[str, int, str], ...]
Growth = dict[Key, tuple[int, float | None]]  # per stack: (bytes grown, share of intervals)


def _last_marker(profile: dict[str, Any]) -> int:
    return max((int(s.get("marker") or 0) for s in profile.get("snapshots") or []), default=0)


def _cut(profile: dict[str, Any], marker: int) -> dict[str, Any]:
    """`profile` without its snapshots past `marker` (one of a single snapshot: as it is)."""
    snapshots = profile.get("snapshots") or []
    keep = [i for i, s in enumerate(snapshots) if int(s.get("marker") or 0) <= marker]
    if len(snapshots) < 2 or len(keep) == len(snapshots) or not keep:
        return profile
    stacks = [{**s, "sizes": [s["sizes"][i] for i in keep if i < len(s["sizes"])]}
              for s in profile.get("stacks") or []]  # fmt: skip
    return {**profile, "snapshots": [snapshots[i] for i in keep], "stacks": stacks}


def aligned(good: dict[str, Any], bad: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Both profiles up to the last step marker both reached (rule 1)."""
    common = min(_last_marker(good), _last_marker(bad))
    return (_cut(good, common), _cut(bad, common)) if common else (good, bad)


def growth(profile: dict[str, Any], since: int | None = None) -> Growth:
    """Per stack: (bytes grown after warm-up, fraction of intervals it grew in). The
    judged snapshots start a third of the way in, or at the first one at step marker
    `since` or later (the pair's other profile's start, rule 2)."""
    snapshots = profile.get("snapshots") or []
    out: Growth = {}
    for stack in profile.get("stacks") or []:
        key = tuple((str(f), int(n), str(fn)) for f, n, fn in stack["frames"])
        sizes = [int(s) for s in stack["sizes"]]
        if len(sizes) < 2:
            out[key] = (sizes[-1] if sizes else 0, None)
            continue
        start = _start(snapshots[: len(sizes)], since) if since else _warm(len(sizes))
        late = sizes[start:]
        steps = list(zip(late, late[1:], strict=False))
        grew = sum(b > a for a, b in steps) / len(steps) if steps else None
        out[key] = (late[-1] - late[0], grew)
    return out


def _warm(snapshots: int) -> int:
    """The first judged snapshot of `snapshots`: a third of the way in."""
    return int((snapshots - 1) * WARMUP_FRACTION)


def _start(snapshots: list[dict[str, Any]], since: int) -> int:
    """The first snapshot at step marker `since` or later (the last one if none is)."""
    markers = [int(s.get("marker") or 0) for s in snapshots]
    return next((i for i, m in enumerate(markers) if m >= since), len(markers) - 1)


def judged(good: dict[str, Any], bad: dict[str, Any]) -> tuple[Growth, Growth]:
    """Each release's growth (rule 2), the first bad one's over no step the last good one's
    was not judged on: its snapshots start at the good run's first judged marker and end at
    its last. Snapshots fall where the timing puts them (the helper spaces them by how long
    they take), so a third of one run's snapshots can be step 5 and the other's step 7, and
    a cache still filling between them would pass for growth in one release only."""
    snapshots = good.get("snapshots") or []
    marked = len(snapshots) >= 2 and all(s.get("marker") for s in snapshots)
    if not marked or len(bad.get("snapshots") or []) < 2:
        return growth(good), growth(bad)
    since = int(snapshots[_warm(len(snapshots))]["marker"])
    bad = _cut(bad, _last_marker(good))
    return growth(good), growth(bad, since=_widened(bad, since))


def _widened(profile: dict[str, Any], since: int) -> int:
    """`since`, or where fewer than two of the profile's snapshots lie from it on (one run
    stalled: its snapshots at markers 1, 3, 12 against the other's 1, 5, 9, 12), the marker
    of its last snapshot before it: a window of one snapshot grows by nothing, and a leak
    would be reported as all native."""
    markers = [int(s.get("marker") or 0) for s in profile.get("snapshots") or []]
    if sum(m >= since for m in markers) >= 2:
        return since
    return max((m for m in markers if m < since), default=since)


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
    before, after = judged(*aligned(good, bad))
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


def python_tracer_needed(native: dict[str, Any]) -> bool:
    """Whether tracemalloc still runs after memray's finding (rule 6)."""
    return not (native.get("available") and native.get("stacks"))


def skipped(tracer: str) -> dict[str, Any]:
    return {**unavailable(tracer, SKIPPED_NOTE), "skipped": True}


def headline(finding: dict[str, Any]) -> str | None:
    """One line for the job's message: the top site, or the note."""
    stacks = finding.get("stacks") or []
    if stacks:
        top = stacks[0]
        return f"grows at {top['site']} (+{top['growth_bytes'] / MIB:.1f} MiB, {finding['tracer']})"
    return None


# --- what the traced runs may cost (rules 7 and 8) -------------------------------------


def judged_intervals(markers: int) -> int:
    """Of `markers` snapshots, the intervals rule 2 judges (after the first third)."""
    return markers - 1 - int((markers - 1) * WARMUP_FRACTION)


def markers_needed(steps: int | None, min_growth_mib: float) -> int | None:
    """Step markers a traced run needs (rule 7); None: no step limit (run to the end)."""
    if not steps or min_growth_mib <= 0:
        return None
    per_step = min_growth_mib * MIB / steps  # the least a leaking release grows a step
    judged = max(MIN_JUDGED_STEPS, math.ceil(CLEAR_FACTOR * MIN_GROWTH_BYTES / per_step))
    markers = judged + 1
    while judged_intervals(markers) < judged:
        markers += 1
    return markers if markers < steps else None


def budget_s(untraced_s: float | None, search_s: float, spent_s: float, ended: int) -> float | None:
    """A traced run's seconds (rule 8): `untraced_s` the candidate's untraced run,
    `search_s` the job's run seconds, `spent_s` and `ended` the traced runs' so far."""
    if not untraced_s or untraced_s <= 0:
        return None
    share = (STAGE_SHARE * search_s - spent_s) / max(1, PLANNED_RUNS - ended)
    return round(max(BUDGET_FLOOR * untraced_s, min(BUDGET_FACTOR * untraced_s, share)), 1)


def trace_stop(
    *,
    steps: int | None,
    untraced_s: float | None,
    min_growth_mib: float,
    search_s: float,
    spent_s: float,
    ended: int,
) -> TraceStop:
    """When a traced run ends before the script does (rules 7 and 8)."""
    return TraceStop(markers=markers_needed(steps, min_growth_mib),
                     seconds=budget_s(untraced_s, search_s, spent_s, ended))  # fmt: skip


def hard_timeout(stop: TraceStop, timeout_s: float) -> float:
    """The runner's kill time for a traced run: twice its budget and a minute for the
    helper's last snapshot and profile, never past the job's own timeout."""
    return timeout_s if stop.seconds is None else min(timeout_s, 2 * stop.seconds + 60)


# --- how the traced runs ended (rule 9) ----------------------------------------------

ENDED_BY = {"markers": "enough", "seconds": "budget", "signal": "signal"}


def stop_of(profile: dict[str, Any] | None) -> dict[str, Any] | None:
    """How one traced run ended: {"by": "end" | "enough" | "budget" | "signal", "markers",
    "seconds", "budget_s"}; None without a profile. The profile is the trial's own
    writing: only numbers of the right kind are kept."""
    if not profile or profile.get("error"):
        return None
    stopped = profile.get("stopped") if isinstance(profile.get("stopped"), dict) else None
    limits = profile.get("limits") if isinstance(profile.get("limits"), dict) else {}

    def number(value: Any) -> float | None:
        ok = isinstance(value, int | float) and not isinstance(value, bool)
        return float(value) if ok and math.isfinite(value) and value >= 0 else None

    markers = number((stopped or profile).get("markers"))
    return {
        "by": ENDED_BY.get(str((stopped or {}).get("by")), "end") if stopped else "end",
        "markers": None if markers is None else int(markers),
        "seconds": number((stopped or {}).get("seconds")),
        "budget_s": number(limits.get("seconds")),
    }


def stops(
    runs: dict[str, dict[str, Any] | None], steps: int | None, untraced_s: dict[str, float | None]
) -> dict[str, Any]:
    """The finding's account of its runs (rule 9): `runs` ({"good"|"bad": `stop_of`}),
    `cut_short` (the report's words, or None) and `stopped` (ended at "enough");
    `steps` the untraced runs' steps, `untraced_s` each release's untraced seconds."""
    of = f" of {steps}" if steps else ""
    cut = [(name, r) for name, r in runs.items() if r and r["by"] == "budget"]
    enough = [r for r in runs.values() if r and r["by"] == "enough"]
    cut_short = stopped = None
    if cut:
        name, run = min(cut, key=lambda item: item[1]["markers"] or 0)
        at = (f"after {run['markers']}{of} steps" if run["markers"]
              else f"at {run['seconds'] or 0:.0f} s")  # fmt: skip
        budget, untraced = run["budget_s"], untraced_s.get(name)
        if budget and untraced:
            why = f"budget {budget / untraced:.1f}x the untraced run of {untraced:.1f} s"
        else:
            why = f"budget {budget:.0f} s" if budget else "budget"
        cut_short = f"cut short {at} ({why})"
    if enough:
        most = max(r["markers"] or 0 for r in enough)
        stopped = f"stopped after {most}{of} steps (enough to compare)"
    return {"runs": runs, "cut_short": cut_short, "stopped": stopped}
