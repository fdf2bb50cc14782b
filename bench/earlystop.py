"""7. Early stopping on the realistic corpus; and the 10-minute repro of section 5.

Section `earlystop` (`run`, `notes`): the looks of a live trial (`contract.earlystop.replay`,
the `EarlyStopper` both watch loops use) replayed over the generated traces of the
realistic corpus (`engine.synthetic.CORPUS`: import ramps, late thread pools, JIT warm-up,
GC, malloc arenas, memory-mapped files, late returns, model loads, and leaks on top of
import ramps), in both forms: with step markers (the import is the set-up before the first
marker) and without. Each run's horizon is what the service would send (`horizon_of`): an
idle run of the same shape with another seed gives its seconds and steps, and the looks
come every `service.specs.look_every(horizon)`. Each run is replayed at the horizon's
pace and slowed 2x (a loaded machine: the import and every step take twice as long).

Tables: false stops of the bounded shapes (runs, stops, rate and its 95 % interval, looks
taken against the budget); the leak shapes (how many stop, when, the time saved); and
the stepped bounded shapes at short horizons with the short-horizon rule turned off (what
MIN_HORIZON_S guards against).

`long_run` and `run_long` (section 5, `bench/e2e.py`, full bench only): the generated
repro `LONG_REPRO` keeps 0.25 MiB every 0.5 s for `LONG_S` seconds (a leak of 30 MiB/min
on a ~10 MiB interpreter, stdlib only) and prints a step marker per iteration (without
markers no run is ever stopped for a leak). It runs under `runners.executor.run_script`
to its end without early stopping (as the good bound of a job does first with --jobs 1),
then with the settings the service would send once that run is the job's horizon. Here
its trace is replayed instead (`LONG_TRACE`).
"""

from __future__ import annotations

import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from bench.classifier import wilson
from bench.common import Config, table
from contract.earlystop import MIN_HORIZON_S, EarlyStopper, replay
from contract.wire import EarlyStop
from engine import synthetic
from runners.executor import run_script
from service.specs import look_every

LONG_S = 600.0
LONG_REPRO = f"""\
import time
keep = []
t0 = time.monotonic()
while time.monotonic() - t0 < {LONG_S}:
    print("::leakbisect-step::", flush=True)
    keep.append(b"x" * (256 * 1024))  # touched pages: resident
    time.sleep(0.5)
"""

BOUNDED = [s for s, truth in synthetic.CORPUS.items() if truth == "bounded"]
LEAKS = [s for s, truth in synthetic.CORPUS.items() if truth == "leak"]
FORMS = ("stepped", "time")
PACES = (1.0, 2.0)
HORIZON_SEED = 1_000_000  # the horizon's run: another seed of the same shape
# Short horizons for the MIN_HORIZON_S table: (steps, seconds a step) at the horizon's pace.
SHORT = ((40, 0.05), (40, 0.25), (200, 0.1), (40, 1.0), (40, 1.5))
FALSE_STOP_TARGET = 0.001


def _trace(
    scenario: str, form: str, seed: int, slow: float, step_s: float | None, steps: int | None
) -> tuple[np.ndarray, np.ndarray, list[tuple[float, int]]]:
    if form == "stepped":
        kw = {} if step_s is None else {"step_s": step_s}
        return synthetic.corpus_stepped(scenario, seed=seed, slow=slow, steps=steps, **kw)
    t, v = synthetic.corpus_trace(scenario, seed=seed, slow=slow)
    return t, v, []


def horizon_of(
    scenario: str, form: str, seed: int, step_s: float | None = None, steps: int | None = None
) -> EarlyStop:
    """The early-stop settings the service sends a run of this shape: the horizon of an idle
    run with another seed (its seconds, and its steps when it prints markers)."""
    t, _, marks = _trace(scenario, form, seed + HORIZON_SEED, 1.0, step_s, steps)
    h = float(t[-1])
    return EarlyStop(horizon_s=h, horizon_steps=len(marks) or None, look_every_s=look_every(h))


def replay_corpus(
    scenario: str, form: str, seed: int, slow: float = 1.0, *, step_s: float | None = None,
    steps: int | None = None, min_horizon_s: float = MIN_HORIZON_S,
) -> dict[str, Any]:  # fmt: skip
    """One corpus run replayed under its horizon's settings: stopped or not, when, the looks."""
    es = horizon_of(scenario, form, seed, step_s, steps)
    t, v, marks = _trace(scenario, form, seed, slow, step_s, steps)
    stopper = EarlyStopper(es, min_horizon_s=min_horizon_s)
    r = replay(t, v, marks, None, stopper)
    return {
        "stopped": r.at is not None, "at": r.at, "duration": float(t[-1]), "looks": r.looks,
        "budget": stopper.budget, "horizon_s": es.horizon_s, "reason": r.reason,
    }  # fmt: skip


def _batch(jobs: list[tuple]) -> list[dict[str, Any]]:
    """A worker's share: replay_corpus over (scenario, form, seed, slow, step_s, steps, min)."""
    out = []
    for scenario, form, seed, slow, step_s, steps, min_h in jobs:
        r = replay_corpus(scenario, form, seed, slow, step_s=step_s, steps=steps,
                          min_horizon_s=min_h)  # fmt: skip
        out.append({"scenario": scenario, "form": form, "slow": slow, "step_s": step_s,
                    "steps": steps, **r})  # fmt: skip
    return out


def _run_all(pool: ProcessPoolExecutor, jobs: list[tuple], workers: int) -> list[dict[str, Any]]:
    chunks = [jobs[k :: 4 * workers] for k in range(4 * workers)]
    return [r for part in pool.map(_batch, [c for c in chunks if c]) for r in part]


def clopper_pearson_upper(k: int, n: int) -> float:
    """The upper end of the exact (Clopper-Pearson) 95 % interval of k / n."""
    from scipy.stats import beta

    return 1.0 if k >= n else float(beta.ppf(0.975, k + 1, n - k))


def rate(x: float) -> str:
    """A small rate in % with enough digits to read 0.1 % against 0.085 %."""
    return f"{100.0 * x:.3f}" if x < 0.01 else f"{100.0 * x:.1f}"


def run(cfg: Config) -> dict[str, Any]:
    n = cfg.pick(250, 3)
    n_leak = cfg.pick(100, 2)
    n_short = cfg.pick(40, 1)
    seeds = [cfg.seed % 100_000 * 1000 + i for i in range(max(n, n_leak, n_short))]
    jobs = [(s, f, seed, slow, None, None, MIN_HORIZON_S) for s in BOUNDED for f in FORMS
            for slow in PACES for seed in seeds[:n]]  # fmt: skip
    jobs += [(s, f, seed, slow, None, None, MIN_HORIZON_S) for s in LEAKS for f in FORMS
             for slow in PACES for seed in seeds[:n_leak]]  # fmt: skip
    short = [(s, "stepped", seed, slow, step_s, steps, 0.0) for steps, step_s in SHORT
             for s in BOUNDED for slow in PACES for seed in seeds[:n_short]]  # fmt: skip
    cfg.log(f"earlystop: {len(jobs)} corpus runs replayed, {len(short)} at short horizons")
    with ProcessPoolExecutor(max_workers=cfg.workers) as pool:
        runs = _run_all(pool, jobs, cfg.workers)
        short_runs = _run_all(pool, short, cfg.workers)
    res: dict[str, Any] = {
        "title": "7. Early stopping",
        "runs_per_cell": n,
        "leak_runs_per_cell": n_leak,
        "short_runs_per_cell": n_short,
        "min_horizon_s": MIN_HORIZON_S,
        "cells": _cells(runs),
        "short": _short_cells(short_runs),
        "long": long_replay(),
        "text": dict(synthetic.CORPUS_TEXT),
    }
    res["pooled"] = _pooled(res["cells"])
    res["tables"] = _tables(res)
    return res


def _cells(runs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per (scenario, form, pace): runs, stops, looks against the budget, stop times and
    time saved, as sums (the means are taken when the tables are written)."""
    out: dict[str, dict[str, Any]] = {}
    for r in runs:
        key = f"{r['scenario']}|{r['form']}|{r['slow']:g}"
        c = out.setdefault(key, {
            "runs": 0, "stops": 0, "looks_sum": 0, "looks_max": 0, "budget_min": r["budget"],
            "budget_max": r["budget"], "over_budget": 0, "at_share_sum": 0.0,
            "saved_s_sum": 0.0, "duration_s_sum": 0.0, "reasons": [],
        })  # fmt: skip
        c["runs"] += 1
        c["looks_sum"] += r["looks"]
        c["looks_max"] = max(c["looks_max"], r["looks"])
        c["budget_min"] = min(c["budget_min"], r["budget"])
        c["budget_max"] = max(c["budget_max"], r["budget"])
        c["over_budget"] += r["looks"] > r["budget"]
        c["duration_s_sum"] += r["duration"]
        if r["stopped"]:
            c["stops"] += 1
            c["at_share_sum"] += r["at"] / r["duration"]
            c["saved_s_sum"] += r["duration"] - r["at"]
            if len(c["reasons"]) < 3:
                c["reasons"].append(r["reason"])
    return out


def _short_cells(runs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for r in runs:
        key = f"{r['steps']}|{r['step_s']:g}|{r['slow']:g}"
        c = out.setdefault(key, {"runs": 0, "stops": 0, "horizon_s_sum": 0.0, "by": {}})
        c["runs"] += 1
        c["horizon_s_sum"] += r["horizon_s"]
        if r["stopped"]:
            c["stops"] += 1
            c["by"][r["scenario"]] = c["by"].get(r["scenario"], 0) + 1
    return out


def _pooled(cells: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """False stops over every bounded run of a form (both paces): the per-run rate."""
    out = {}
    for form in FORMS:
        k = sum(cells[f"{s}|{form}|{p:g}"]["stops"] for s in BOUNDED for p in PACES)
        n = sum(cells[f"{s}|{form}|{p:g}"]["runs"] for s in BOUNDED for p in PACES)
        lo, hi = wilson(k, n)
        out[form] = {"runs": n, "stops": k, "rate": k / n if n else 0.0, "wilson": [lo, hi],
                     "clopper_pearson_upper": clopper_pearson_upper(k, n)}  # fmt: skip
    return out


FORM_TEXT = {"stepped": "with markers", "time": "no markers"}


def _tables(res: dict[str, Any]) -> list[dict[str, Any]]:
    cells, text = res["cells"], res["text"]
    rows = []
    for s in BOUNDED:
        for form in FORMS:
            for p in PACES:
                c = cells[f"{s}|{form}|{p:g}"]
                lo, hi = wilson(c["stops"], c["runs"])
                rows.append([text[s], FORM_TEXT[form], f"{p:g}x", c["runs"], c["stops"],
                             rate(c["stops"] / c["runs"]), f"{rate(lo)}–{rate(hi)}",
                             f"{c['looks_sum'] / c['runs']:.1f} / {c['looks_max']}",
                             f"{c['budget_min']}–{c['budget_max']}"])  # fmt: skip
    for form in FORMS:
        pl = res["pooled"][form]
        rows.append([f"**all bounded shapes, {FORM_TEXT[form]}**", FORM_TEXT[form], "1x and 2x",
                     pl["runs"], pl["stops"], rate(pl["rate"]),
                     f"{rate(pl['wilson'][0])}–{rate(pl['wilson'][1])} (exact ≤ "
                     f"{rate(pl['clopper_pearson_upper'])})", "", ""])  # fmt: skip
    out = [table(
        f"Early stopping on the bounded shapes of the corpus: false stops, {res['runs_per_cell']} "
        "runs per row",
        ["shape", "form", "pace", "runs", "stopped", "rate %", "95 % interval %",
         "leak looks tested (mean / max)", "budget m (its horizon's)"],
        rows,
        "Every run has a heavy import ramp first (100-500 MiB over 1-10 s; with markers it is "
        "the set-up before the first one). Pace 2x: the run is slowed twice over (a loaded "
        "machine), the horizon is an idle run's. Interval: Wilson's; exact: the upper end of the "
        "Clopper-Pearson 95 % interval. A run without markers is never looked at for a leak "
        "(contract/earlystop.py rule 2), so its row measures the memory-cap rule alone.",
    )]  # fmt: skip
    rows = []
    for s in LEAKS:
        for form in FORMS:
            for p in PACES:
                c = cells[f"{s}|{form}|{p:g}"]
                k = c["stops"]
                rows.append([text[s], FORM_TEXT[form], f"{p:g}x", c["runs"], k,
                             f"{100 * c['at_share_sum'] / k:.0f}" if k else "–",
                             f"{c['saved_s_sum'] / k:.0f}" if k else "–",
                             f"{100 * c['saved_s_sum'] / c['duration_s_sum']:.0f}",
                             f"{c['looks_sum'] / c['runs']:.1f}"])  # fmt: skip
    out.append(table(
        f"Early stopping on the leak shapes: {res['leak_runs_per_cell']} runs per row",
        ["shape", "form", "pace", "runs", "stopped early", "stopped at (% of the run)",
         "saved per stopped run (s)", "saved, % of all these runs' time", "leak looks tested"],
        rows,
        "Runs with markers: 200 steps of about 1 s (300 for the slow leak); without: 300 s "
        "(600 s). A leak not stopped runs to its end and the classifier calls it there.",
    ))  # fmt: skip
    out.append(_short_table(res))
    out.append(_long_table(res["long"]))
    return out


def _short_table(res: dict[str, Any]) -> dict[str, Any]:
    rows = []
    for steps, step_s in SHORT:
        for p in PACES:
            c = res["short"][f"{steps}|{step_s:g}|{p:g}"]
            by = ", ".join(f"{k} {v}" for k, v in sorted(c["by"].items())) or "–"
            rows.append([f"{c['horizon_s_sum'] / c['runs']:.0f}", f"{steps} x {step_s:g} s",
                         f"{p:g}x",
                         c["runs"], c["stops"], rate(c["stops"] / c["runs"]), by])  # fmt: skip
    return table(
        f"Why MIN_HORIZON_S = {res['min_horizon_s']:g} s: the bounded shapes with markers at "
        f"short horizons, that rule turned off, {res['short_runs_per_cell']} runs per shape",
        ["horizon (s, mean)", "steps", "pace", "runs", "stopped", "rate %", "stopped shapes"],
        rows,
        "Seconds-long processes (a model load, threads and arenas starting, a GC settling) "
        "span many steps of a short loop and read as a leak over the steps up to a look.",
    )


# A generated trace shaped like LONG_REPRO: a ~10 MiB interpreter keeping 0.25 MiB every
# 0.5 s for LONG_S, sampled as the sampler does (50 Hz for 30 s, then 10 Hz), markers each 0.5 s.
def long_trace(seed: int = 0) -> tuple[np.ndarray, np.ndarray, list[tuple[float, int]]]:
    rng = np.random.default_rng(seed)
    t = np.concatenate([np.arange(0, 30, 0.02), np.arange(30, LONG_S, 0.1)])
    steps = np.floor(t / 0.5)
    mib = 10.0 + 0.25 * steps + synthetic.ar1_noise(len(t), 10.0, 0.2, 2.0, rng)
    marks = [(float(0.5 * k + 0.001), int(k) + 1) for k in range(int(LONG_S / 0.5))]
    return t, np.round(mib * 1024 * 1024), marks


def long_replay() -> list[dict[str, Any]]:
    """LONG_REPRO's trace replayed: with its markers, and as it was before (no markers)."""
    t, v, marks = long_trace()
    out = []
    for label, m in (("with a marker per iteration (LONG_REPRO now)", marks),
                     ("without markers (LONG_REPRO before #23)", [])):  # fmt: skip
        es = EarlyStop(horizon_s=LONG_S, horizon_steps=len(m) or None,
                       look_every_s=look_every(LONG_S))  # fmt: skip
        stopper = EarlyStopper(es)
        r = replay(t, v, m, None, stopper)
        out.append({"how": label, "at": r.at, "looks": r.looks, "budget": stopper.budget,
                    "reason": r.reason})  # fmt: skip
    return out


def _long_table(long: list[dict[str, Any]]) -> dict[str, Any]:
    rows = [[r["how"], "not stopped" if r["at"] is None else f"{r['at']:.0f}",
             f"{LONG_S - (r['at'] or LONG_S):.0f}", f"{r['looks']} of {r['budget']}",
             r["reason"] or "–"] for r in long]  # fmt: skip
    return table(
        f"The {LONG_S:.0f} s generated repro of section 5, replayed (horizon: one full run)",
        ["repro", "stopped at (s)", "saved (s)", "leak looks", "why"],
        rows,
        "A generated trace of LONG_REPRO (0.25 MiB kept every 0.5 s on a ~10 MiB interpreter), "
        "sampled as the sampler does; section 5 runs the repro itself (full bench only).",
    )


def notes(res: dict[str, Any]) -> list[str]:
    """What the numbers say, from the stored results (so the text can be re-rendered)."""
    pl = res["pooled"]
    st, tm = pl["stepped"], pl["time"]
    cells = res["cells"]
    leak_stops = {s: sum(cells[f"{s}|stepped|{p:g}"]["stops"] for p in PACES) for s in LEAKS}
    leak_runs = {s: sum(cells[f"{s}|stepped|{p:g}"]["runs"] for p in PACES) for s in LEAKS}
    ok = st["clopper_pearson_upper"] <= FALSE_STOP_TARGET and st["wilson"][1] <= FALSE_STOP_TARGET
    within = not any(c["over_budget"] for c in cells.values())
    out = [
        f"False stops with markers: {st['stops']} of {st['runs']} bounded runs "
        f"({rate(st['rate'])} %; 95 % interval {rate(st['wilson'][0])}–{rate(st['wilson'][1])} "
        f"%, exact upper end {rate(st['clopper_pearson_upper'])} %): the target of at most "
        f"0.1 % per run {'holds' if ok else 'is not shown by this many runs'}. Without markers "
        f"{tm['stops']} of {tm['runs']}: such runs are never looked at for a leak. "
        + (
            "Every run tested at most its budget m of leak looks; slowed 2x, a bounded run "
            "spends all of it."
            if within
            else "**A run tested more looks than its budget.**"
        ),
        "Leaks with markers stopped early: "
        + ", ".join(
            f"{res['text'][s].split(' (')[0]} {leak_stops[s]} of {leak_runs[s]}" for s in LEAKS
        )  # fmt: skip
        + "; the others run to their end and are called there.",
        f"The short-horizon rule: no leak look while the horizon is under "
        f"{res['min_horizon_s']:g} s, where a stop saves at most half of it; the last table "
        "shows what happens without it.",
    ]
    long = res.get("long") or []
    if long:
        on = long[0]
        out.append(
            f"The {LONG_S:.0f} s repro of section 5, replayed: "
            + (
                "not stopped"
                if on["at"] is None
                else f"stopped at {on['at']:.0f} s, {LONG_S - on['at']:.0f} s saved"
            )  # fmt: skip
            + " with a marker per iteration; without markers it runs to its end."
        )
    return out


def long_run(work: Path, early: EarlyStop | None) -> dict[str, Any]:
    """One 10-minute repro run under the sampler; early: its early-stop settings or None."""
    work.mkdir(parents=True, exist_ok=True)
    script = work / "long_repro.py"
    script.write_text(LONG_REPRO)
    started = time.monotonic()
    ex = run_script(sys.executable, script, cwd=work, timeout_s=LONG_S + 300,
                    memory_limit_bytes=None, early_stop=early, run_as=None)  # fmt: skip
    return {
        "how": "with early stopping" if early is not None else "without (--no-early-stop)",
        "early_stop": early is not None,
        "wall_s": time.monotonic() - started,
        "duration_s": ex.duration_s,
        "exit_code": ex.exit_code,
        "stopped_early": ex.stopped_early,
        "samples": len(ex.samples),
        "steps": len(ex.steps),
        "looks": None if ex.early_stop is None else ex.early_stop.looks,
    }


def settings_for(horizon_s: float, steps: int | None = None) -> EarlyStop:
    """What the service sends a trial of a default job whose longest full run took
    horizon_s and printed `steps` markers."""
    return EarlyStop(horizon_s=horizon_s, horizon_steps=steps or None,
                     look_every_s=look_every(horizon_s))  # fmt: skip


if __name__ == "__main__":  # one mode, for a measurement by hand: `python -m bench.earlystop on`
    import json

    mode = sys.argv[1]
    steps = int(LONG_S / 0.5)
    res = long_run(Path(sys.argv[2]), settings_for(LONG_S, steps) if mode == "on" else None)
    print(json.dumps(res))


def run_long(work: Path, log: Any) -> list[dict[str, Any]]:
    """Without early stopping to the end (the horizon), then with it."""
    log(f"e2e: generated {LONG_S:.0f} s repro, without early stopping")
    off = long_run(work / "off", None)
    log(f"e2e: generated {LONG_S:.0f} s repro, with early stopping")
    on = long_run(work / "on", settings_for(off["duration_s"], off["steps"]))
    return [off, on]
