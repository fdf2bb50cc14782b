"""Turns the measurements' results into `benchmarks.md` and PNG plots under `bench/`.

`write(results, out)` writes `out/benchmarks.md`, `out/bench/*.png` and
`out/bench/results.json` (every number, for anyone who wants to re-plot). Every table is
followed by the machine it ran on and the command that produced it.
"""

from __future__ import annotations

import importlib
import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

SECTIONS = (
    "classifier", "bisection", "envs", "sampler", "e2e", "speed", "neighbours", "earlystop",
    "pace",
)  # fmt: skip
HEADINGS = {
    "classifier": "## 1. Classifier accuracy",
    "bisection": "## 2. Bisection cost",
    "envs": "## 3. Environment build time",
    "sampler": "## 4. Sampler overhead and fidelity",
    "e2e": "## 5. End to end",
    "speed": "## 6. Speed",
    "neighbours": "## 7. Verdicts under a noisy neighbour",
    "earlystop": "## 8. Early stopping",
    "pace": "## 9. Pace and load",
}
INTROS = {
    "classifier": (
        "Seeded traces from `engine.synthetic` (10 Hz, 500 MiB baseline, AR(1) noise of "
        "3 MiB with a 2 s correlation time, an import ramp at the start), judged by our "
        "classifier (`engine.analysis.classify_series`, default settings) and by the three "
        "rules people use instead. The alternatives get the same warm-up dropped (the first "
        "20 % of the run) and our own threshold T, so the comparison is about the decision "
        "rule alone. The minimum run length is measured: the leak scenarios are swept over run "
        "lengths, and the minimum is the shortest from which detection stays at or above "
        "95 %; the targets are checked at that length. The realistic corpus (a heavy import "
        "ramp of 100-500 MiB under every shape: thread pools, JIT warm-up, GC, malloc arenas, "
        "memory-mapped files, late returns, a late model load, and leaks behind the import) is "
        "judged in both forms, with step markers and without."
    ),
    "bisection": (
        "Simulated ranges with exact verdicts, so this measures the search alone. Our planner "
        "spends two evaluations on the bounds (a good bound that already leaks, or a bad bound "
        "that does not, is the most common way a bisection lies), two on re-running the "
        "boundary pair and at most one on a witness above the first bad release (a later "
        "release that does not leak means the range is not monotone, and the report says so); "
        "plain binary search spends none on any and so cannot notice a wrong bound, a flaky "
        "verdict or a second transition. Slots buy wall time, not trials. --all-transitions "
        "maps every transition: every release once, then both sides of each transition again."
    ),
    "envs": (
        "Per candidate, each arm into a fresh directory. `build_env` is what a runner does per "
        "candidate (find the Python, `uv venv`, `uv pip install`, `uv pip freeze`); the "
        "alternative is what a shell loop does: `python -m venv` then `pip install`."
    ),
    "sampler": (
        "`runners.sampler.Sampler` reads RSS from `/proc` for every process of the tree at each "
        "sample and re-lists the tree once a second. Overhead is its CPU time against the "
        "workload's; fidelity is how soon a real leak of a known rate is called LEAK on the "
        "live series."
    ),
    "e2e": (
        "The whole local bisection of the offline fixture against the loop people write by "
        "hand. The naive loop is this bash script, run as is:"
    ),
    "speed": (
        "The issue's speed target: bisect-cli at least 3x faster end to end than the naive "
        "venv + pip loop of section 5, measured in the same run, on the bundled fixture and "
        "on a generated 32-release range (first bad 1.0.21). bisect-cli runs with a warm uv "
        "cache and a fresh database, with one trial at a time and with two side by side "
        "(`--jobs 2`); a first cold run fills the cache and is not counted."
    ),
    "neighbours": (
        "The same bisections and repro shapes idle, with a CPU hog on every core (one busy "
        "process per core) and under memory pressure (another process holding half the "
        "memory available, at most 8 GiB, and writing it again and again): the offline "
        "fixture, and two packages shaped like real ML packages (`service.example.realistic`: "
        "numpy, scipy and 200 MiB written on import, before the repro's first step marker), "
        "with `bisect-cli run --no-attribute`; and every script of `service.example.shapes` "
        "(import ramps, thread pools, compile caches, the GC, malloc arenas, mmap, late "
        "returns, a late model load, and three leaks behind a heavy import), judged as a "
        "runner would. A verdict that changes under load is a wrong verdict."
    ),
    "earlystop": (
        "Whether ending a run early can turn a clean release into a leak, measured on the "
        "realistic corpus of `engine.synthetic` (`CORPUS`: a heavy import ramp under every "
        "shape; thread pools, JIT warm-up, GC, malloc arenas, memory-mapped files, an allocator "
        "returning memory late, a model loaded after the first marker; and leaks), with step "
        "markers and without, at the horizon's pace and slowed 2x. Each run is replayed look by "
        "look through `contract.earlystop.replay`, the `EarlyStopper` the runners use live, under "
        "the settings the service would send (the horizon of an idle run of the same shape). The "
        "rule's target: at most 0.1 % of bounded runs stopped, shown by the upper end of the "
        "95 % interval."
    ),
    "pace": (
        "Whether the answer depends on the repro's pace or the machine's load (issue #35): real "
        "`bisect-cli run --no-attribute` bisections of the offline fixture (leakyfixture "
        "1.0.0..1.0.9, first bad 1.0.6) for three leak shapes, each with its bounded noise on "
        "every release (the steady 1 MiB a step with spikes, a cache and churn; the spike "
        "workload, 3 MiB a step and a 200 MiB buffer touched page by page every 10th step; a "
        "native leak through malloc), at three paces (unpaced, about 40 ms a step of ETL work; "
        "0.1 s; 1 s, with 20 steps), with step markers and without, idle and with a CPU hog on "
        "every core, several bisections each, and what unpaced 50-step repros of about 0.3 s "
        "and 2 s return at the defaults. Written by `uv run python -m bench.pace` (which also "
        "writes docs/bench-pace.md, every bisection's runs) or `python -m bench --only pace`. "
        "Target: every leak found at every pace and load, no false leak, and no inconclusive "
        "verdict on a leak that grows ten times the threshold."
    ),
}


def md_table(t: dict[str, Any], footer: str) -> str:
    """One table as Markdown: its caption, rows and note, then `footer`."""
    lines = [f"**{t['caption']}**", ""]
    lines.append("| " + " | ".join(t["headers"]) + " |")
    lines.append("| " + " | ".join("---" for _ in t["headers"]) + " |")
    for row in t["rows"]:
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in row) + " |")
    lines.append("")
    if t.get("note"):
        lines += [t["note"], ""]
    lines += [footer, ""]
    return "\n".join(lines)


def footer(sec: dict[str, Any]) -> str:
    """The machine, tools, load, command and time a section was measured with, in small print."""
    m = sec["machine"]
    load = sec.get("load")
    load_txt = f"; load average {load[0]:.2f} → {load[1]:.2f}" if load else ""
    return (
        f"<sub>Machine: {m['summary']}; {m['uv']}{load_txt}. "
        f"Command: `{sec['command']}` ({sec['when']}, {sec['elapsed_s']:.0f} s).</sub>"
    )


# ---------------------------------------------------------------------------- plots


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_classifier(sec: dict[str, Any], dest: Path) -> list[tuple[str, str]]:
    plt = _plt()
    figs = []
    methods = list(sec["labels"])
    length = sec["min_run_length_min"]
    scen = list(sec["scenarios"])
    fig, ax = plt.subplots(figsize=(11, 4.5))
    width = 0.8 / len(methods)
    for k, m in enumerate(methods):
        ys = []
        for s in scen:
            c = sec["main"][f"{s}@{length:g}"][m]
            ys.append(100.0 * c["leak"] / sum(c.values()))
        xs = [i + (k - (len(methods) - 1) / 2) * width for i in range(len(scen))]
        ax.bar(xs, ys, width, label=sec["labels"][m])
    ax.set_xticks(range(len(scen)))
    ax.set_xticklabels([f"{s}\n({sec['scenarios'][s]})" for s in scen], fontsize=8)
    ax.axhline(95, color="grey", ls=":", lw=1)
    ax.axhline(1, color="grey", ls=":", lw=1)
    ax.set_ylabel("% of traces called LEAK")
    ax.set_title(
        f"Called LEAK, {length:g}-minute runs: false leaks on bounded scenarios, detection on leaks"
    )
    ax.legend(fontsize=8, ncol=4, loc="upper left")
    ax.set_ylim(0, 105)
    fig.tight_layout()
    name = "classifier_rates.png"
    fig.savefig(dest / name, dpi=110)
    plt.close(fig)
    figs.append((name, "Share of traces called LEAK per scenario and rule"))

    fig, ax = plt.subplots(figsize=(8, 4.5))
    grid = [float(g) for g in sec["grid_min"]]
    slow = sec["sweep"]["slow_leak"]
    for m in methods:
        ys = [100.0 * slow[f"{g:g}"][m]["leak"] / sum(slow[f"{g:g}"][m].values()) for g in grid]
        ax.plot(grid, ys, marker="o", label=f"{sec['labels'][m]}: LEAK")
    ys = [
        100.0 * slow[f"{g:g}"]["ours"]["inconclusive"] / sum(slow[f"{g:g}"]["ours"].values())
        for g in grid
    ]
    ax.plot(grid, ys, ls="--", color="C0", alpha=0.6, label="leakbisect: inconclusive")
    ax.axhline(95, color="grey", ls=":", lw=1)
    ax.axvline(sec["minimum_per_scenario"].get("slow_leak") or grid[-1], color="C0", ls=":")
    ax.set_xlabel("run length (minutes)")
    ax.set_ylabel("% of slow-leak traces")
    ax.set_title("Slow leak (0.5 % of baseline per minute): detection vs run length")
    ax.legend(fontsize=8)
    fig.tight_layout()
    name = "classifier_sweep.png"
    fig.savefig(dest / name, dpi=110)
    plt.close(fig)
    figs.append((name, "Slow-leak detection against run length"))
    return figs


def plot_bisection(sec: dict[str, Any], dest: Path) -> list[tuple[str, str]]:
    plt = _plt()
    from matplotlib.ticker import NullFormatter, ScalarFormatter

    sizes = sec["sizes"]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for key, res in sec["results"].items():
        axes[0].plot(sizes, [res[str(n)]["trials_mean"] for n in sizes], marker="o", label=key)
        axes[1].plot(
            sizes,
            [res[str(n)]["rounds_mean"] * sec["trial_s"] / 60 for n in sizes],
            marker="o",
            label=key,
        )
    axes[0].plot(sizes, [math.ceil(math.log2(n)) for n in sizes], "k--", label="ceil(log2 n)")
    for ax, what in zip(axes, ("mean trials", "mean wall time (min)"), strict=True):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xticks(sizes)
        ax.set_xticklabels([str(n) for n in sizes])
        ax.set_xlabel("releases in the range")
        ax.set_ylabel(what)
        lo, hi = ax.get_ylim()
        ax.set_yticks(
            [y for y in (1, 2, 3, 5, 10, 20, 30, 50, 100, 200, 300, 500) if lo <= y <= hi]
        )
        ax.yaxis.set_major_formatter(ScalarFormatter())
        ax.yaxis.set_minor_formatter(NullFormatter())
    axes[0].legend(fontsize=7)
    axes[1].set_title(f"one evaluation = {sec['trial_s'] / 60:g} min", fontsize=9)
    fig.tight_layout()
    name = "bisection.png"
    fig.savefig(dest / name, dpi=110)
    plt.close(fig)
    return [(name, "Trials and simulated wall time against range size")]


def plot_envs(sec: dict[str, Any], dest: Path) -> list[tuple[str, str]]:
    import statistics

    plt = _plt()
    sets = list(sec["sets"])
    arms = list(next(iter(sec["sets"].values())))
    fig, ax = plt.subplots(figsize=(10, 4.2))
    width = 0.8 / len(arms)
    for k, arm in enumerate(arms):
        ys = [statistics.median(sec["sets"][s][arm]) for s in sets]
        xs = [i + (k - (len(arms) - 1) / 2) * width for i in range(len(sets))]
        ax.bar(xs, ys, width, label=arm)
    ax.set_xticks(range(len(sets)))
    ax.set_xticklabels([s.split(" (")[0] for s in sets])
    ax.set_yscale("log")
    ax.set_ylabel("seconds per candidate (median, log scale)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    name = "envs.png"
    fig.savefig(dest / name, dpi=110)
    plt.close(fig)
    return [(name, "Environment build time per candidate")]


PLOTS = {"classifier": plot_classifier, "bisection": plot_bisection, "envs": plot_envs}


# ------------------------------------------------------------------------ headlines


def _classifier_lines(c: dict[str, Any]) -> list[str]:
    out: list[str] = []
    f, d = c["worst_false_leak"], c["worst_detection"]
    lab = c["labels"]
    out.append(
        f"**Classifier** ({c['traces_per_scenario']} traces per scenario, "
        f"{c['min_run_length_min']:g}-minute runs): worst false-leak rate on a bounded "
        f"scenario {100 * f['ours']:.1f} % for ours against "
        + ", ".join(f"{100 * f[m]:.1f} % for {lab[m]}" for m in ("last_first", "peak", "ols"))
        + f"; worst detection on a leak scenario {100 * d['ours']:.1f} % (ours) against "
        + ", ".join(f"{100 * d[m]:.1f} %" for m in ("last_first", "peak", "ols"))
        + "."
    )
    mins = c["minimum_per_scenario"]
    out.append(
        f"**Minimum run length**: {c['min_run_length_min']:g} minutes"
        + ("" if c["min_run_length_reached"] else " (95 % not reached on the grid)")
        + " without step markers, set by the slow leak (0.5 % of baseline per minute); "
        + "; ".join(
            f"{s} {'not reached' if v is None else f'{v:g} min'}" for s, v in mins.items()
        )
        + "."
    )
    if "pooled_worst_false_leak" in c:
        pf = c["pooled_worst_false_leak"]
        out.append(
            f"**Pooled runs** ({c['candidates_per_pooled_row']} candidates per row, noisy "
            "conditions): worst false leak on a bounded row "
            + ", ".join(f"{100 * v:.1f} % {k}" for k, v in pf.items())
            + "."
        )
    if c["misses"]:
        out.append("**Targets missed by our classifier**: " + "; ".join(c["misses"]) + ".")
    else:
        out.append(
            "**Targets**: all met at the minimum run length (false leak ≤ 1 % on every "
            "bounded scenario, detection ≥ 95 % on every leak scenario)."
        )
    return out


def _bisection_lines(b: dict[str, Any]) -> list[str]:
    out: list[str] = []
    parts = []
    for n in b["sizes"]:
        r = b["results"]
        ours = r["leakbisect planner (1 slot)"][str(n)]["trials_mean"]
        lin = r["linear scan from the good end (1 slot)"][str(n)]["trials_mean"]
        bs = r["binary search, no bound checks (1 slot)"][str(n)]["trials_mean"]
        w1 = r["leakbisect planner (1 slot)"][str(n)]["rounds_mean"]
        w4 = r["leakbisect planner (4 slots)"][str(n)]["rounds_mean"]
        parts.append(
            f"n = {n}: {ours:.1f} trials (ours, 1 slot) vs {lin:.1f} linear "
            f"({lin / ours:.1f}x) vs {bs:.1f} plain binary; 4 slots cut wall time "
            f"{w1 / w4:.1f}x"
        )
    out.append("**Bisection** (mean trials): " + "; ".join(parts) + ".")
    return out


def _envs_lines(e: dict[str, Any]) -> list[str]:
    out: list[str] = []
    parts = []
    for label, h in e["headline"].items():
        parts.append(
            f"{label.split(' (')[0]}: uv warm {h['uv_warm']:.2f} s vs venv + pip "
            f"{h['pip_cold']:.1f} s cold / {h['pip_warm']:.1f} s warm "
            f"({h['pip_cold'] / h['uv_warm']:.0f}x / {h['pip_warm'] / h['uv_warm']:.0f}x); "
            f"uv cold {h['uv_cold']:.2f} s"
        )
    out.append("**Environments** (median per candidate): " + "; ".join(parts) + ".")
    return out


def _sampler_lines(s: dict[str, Any]) -> list[str]:
    out: list[str] = []
    o = {(r["procs"], r["hz"]): r for r in s["overhead"]}
    parts = []
    for (procs, hz), r in sorted(o.items()):
        parts.append(
            f"{procs} proc @ {hz:g} Hz: {100 * r['sampler_cpu_s'] / r['wall_s']:.2f} % of a "
            f"core ({100 * r['sampler_cpu_s'] / max(r['workload_cpu_s'], 1e-9):.1f} % of "
            "the workload's CPU)"
        )
    det = []
    for f in s["fidelity"]:
        if not f["rate_mib_s"]:
            continue
        t = f["first_leak_s"]["ours"]
        det.append(
            f"{f['rate_mib_s']:g} MiB/s leak called after "
            + (f"{t:.1f} s" if t is not None else f"> {f['max_s']:g} s")
            + f" (floor {f['floor_s']:.1f} s)"
        )
    out.append("**Sampler**: " + "; ".join(parts) + ". " + "; ".join(det) + ".")
    return out


def _e2e_lines(x: dict[str, Any]) -> list[str]:
    out: list[str] = []
    from bench.e2e import bundled_runs, mean_wall  # lazily, like the sections' notes

    runs = x["runs"]
    cli, naive = bundled_runs(runs)
    if cli and naive:
        cli_s, naive_s = mean_wall(cli), mean_wall(naive)
        out.append(
            f"**End to end** (fixture, bundled repro): bisect-cli {cli_s:.0f} s on average "
            f"over {len(cli)} run{'s' if len(cli) > 1 else ''} (cold uv cache "
            f"{cli[0]['wall_s']:.0f} s), right in {sum(r['right'] for r in cli)} of "
            f"{len(cli)} (answers: "
            + ", ".join(r["answer"] or r["status"] for r in cli)
            + f"); the naive venv + pip loop {naive_s:.0f} s on average "
            f"({naive_s / cli_s:.1f}x bisect-cli's time), right in "
            f"{sum(r['right'] for r in naive)} of {len(naive)} (answers: "
            + ", ".join(r["answer"] or "none" for r in naive)
            + ")."
        )
    other = [r for r in runs if not r["repro"].startswith("bundled")]
    if other:
        out.append(
            "**End to end, repro stopped at 36 steps**: "
            + "; ".join(
                f"{r['how'].split(':')[0]}: {r['answer'] or 'no answer'} "
                f"({'right' if r['right'] else 'not right'}"
                + (f": {r['message']}" if r.get("message") else "")
                + ")"
                for r in other
            )
            + "."
        )
    return out


def _speed_lines(x: dict[str, Any]) -> list[str]:
    from bench.speed import summary

    parts = [
        f"{s['range']} `{s['how'].removeprefix('bisect-cli run ')}` {s['speedup']:.1f}x"
        for s in summary(x["runs"])
        if s["speedup"] is not None and not s["how"].startswith("naive")
    ]
    return ["**Speed** (bisect-cli against the naive loop, warm uv cache): " + "; ".join(parts)]


def _neighbours_lines(x: dict[str, Any]) -> list[str]:
    from bench.neighbours import notes

    return ["**Noisy neighbours**: " + notes(x)[0]]


def _earlystop_lines(x: dict[str, Any]) -> list[str]:
    st = x["pooled"]["stepped"]
    return [
        f"**Early stopping** (realistic corpus with import ramps, runs with markers, idle and "
        f"slowed 2x): {st['stops']} false stops in {st['runs']} bounded runs, 95 % upper end "
        f"{100 * st['clopper_pearson_upper']:.3f} % (target ≤ 0.1 %); no leak look under a "
        f"{x['min_horizon_s']:g} s horizon or without markers."
    ]


def _pace_lines(x: dict[str, Any]) -> list[str]:
    from bench.pace import notes

    return ["**Pace and load**: " + notes(x)[0]]


_HEADLINES: dict[str, Callable[[dict[str, Any]], list[str]]] = {
    "classifier": _classifier_lines,
    "bisection": _bisection_lines,
    "envs": _envs_lines,
    "sampler": _sampler_lines,
    "e2e": _e2e_lines,
    "speed": _speed_lines,
    "neighbours": _neighbours_lines,
    "earlystop": _earlystop_lines,
    "pace": _pace_lines,
}


def headlines(results: dict[str, Any]) -> list[str]:
    """One paragraph per benchmark section present in ``results``, in report order."""
    out = []
    for section, lines in _HEADLINES.items():
        if results.get(section):
            out.extend(lines(results[section]))
    return out


# --------------------------------------------------------------------------- write


def render(results: dict[str, Any], images: dict[str, list[tuple[str, str]]]) -> str:
    any_sec = next(iter(results.values()))
    lines = [
        "# Benchmarks",
        "",
        "Each measurement side by side with the alternative people use, in the same run. "
        "Written by the benchmark harness in `bench/` (`uv run python -m bench`; "
        "`--quick --out DIR` for the CI-sized run the tests exercise). Nothing here is a timed "
        "test: the numbers are measured on the machine named under every table, which was "
        "shared with other jobs while they ran (the load average is given).",
        "",
        f"- Machine: {any_sec['machine']['summary']}",
        f"- Tools: {any_sec['machine']['uv']}",
        f"- Code: {any_sec['machine'].get('revision', 'unknown')}",
        f"- Command: `{any_sec['command']}`",
        "",
        "## Headlines",
        "",
    ]
    lines += [f"- {h}" for h in headlines(results)]
    lines.append("")
    for key in SECTIONS:
        lines += [HEADINGS[key], ""]
        sec = results.get(key)
        if sec is None:
            lines += ["Not measured in this run.", ""]
            continue
        lines += [INTROS[key], ""]
        notes = importlib.import_module(f"bench.{key}").notes(sec)
        if notes:
            lines += ["What it shows:", ""]
            lines += [f"- {n}" for n in notes]
            lines.append("")
        if key == "e2e":
            lines += ["```bash", sec["naive_loop_script"].rstrip(), "```", ""]
        under = footer(sec)
        for t in sec["tables"]:
            lines.append(md_table(t, under))
        for name, alt in images.get(key, []):
            lines += [f"![{alt}](bench/{name})", ""]
    lines += [
        "## Reproduce",
        "",
        "```console",
        "uv sync                                      # matplotlib is in the dev group",
        "uv run python -m bench                       # every section, writes docs/benchmarks.md",
        "uv run python -m bench --only envs,e2e       # some, merged into the last results",
        "uv run python -m bench --quick --out /tmp/b  # CI-sized",
        "uv run python -m bench --render              # rewrite the text and plots only",
        "uv run python -m bench.pace --repeats 1      # section 9 alone, a subset of its cells",
        "```",
        "",
        "Raw numbers: `bench/results.json` next to this file.",
        "",
    ]
    return "\n".join(lines)


def merge(out: Path, key: str, sec: dict[str, Any]) -> Path:
    """Put one section's results beside the others in OUT/bench/results.json and rewrite
    OUT/benchmarks.md and the plots from them all (a standalone run of one section)."""
    previous = Path(out) / "bench" / "results.json"
    results = json.loads(previous.read_text()) if previous.exists() else {}
    results[key] = sec
    return write({k: results[k] for k in SECTIONS if k in results}, out)


def write(results: dict[str, Any], out: Path) -> Path:
    out = Path(out)
    img = out / "bench"
    img.mkdir(parents=True, exist_ok=True)
    images: dict[str, list[tuple[str, str]]] = {}
    for key, fn in PLOTS.items():
        if key in results:
            images[key] = fn(results[key], img)
    (img / "results.json").write_text(json.dumps(results, indent=1, default=str) + "\n")
    md = out / "benchmarks.md"
    md.write_text(render(results, images))
    return md
