"""5. End to end: find the first bad release of the offline fixture, two ways.

The fixture (`service.example.fixture`: leakyfixture 1.0.0..1.0.9, first leaking 1.0.6,
1.0.4 only a Windows wheel, 1.0.3 yanked, bounded spikes and a cache in every release) is
served on 127.0.0.1 and searched:

- by `bisect-cli run REPRO --package leakyfixture --range 1.0.0..1.0.9 --index-url URL
  --json --no-attribute` (the release search alone; tracing is bench/stages.py's), with an
  empty uv cache and a fresh database (cold), and in a full run 4 more times with the uv
  cache the cold run filled (warm; new environments, new database);
- by a naive shell loop (`NAIVE_LOOP` below, run with bash; 5 times in a full run, as
  its answer varies): from the good end, for each release `python -m venv` + `pip
  install` from the same index, run the repro while `ps` reads its RSS every 0.1 s, and
  blame the first release whose last-minus-first RSS exceeds 8 MiB (our classifier's
  absolute threshold).

A full run repeats both with the same repro stopped after 36 steps instead of 40, so the
run ends while a bounded checkpoint-like spike is still held: where the loop stops
decides what "last" means.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

from bench.common import Config, clean_env, reachable_tmpdir, secs, stopwatch, table
from bench.earlystop import LONG_S, run_long
from service.example.fixture import FixtureSpec, build_fixture
from service.example.index import serve_index

REPRO = Path(__file__).resolve().parents[1] / "service" / "example" / "repro.py"
EXPECTED = "1.0.6"
NAIVE_THRESHOLD_KIB = 8 * 1024
# Neither answer is certain: the naive loop's first `ps` sample lands anywhere from bash's
# fork to the repro's imports, and our verdicts on 2-second runs on a busy machine can
# come out inconclusive or flaky. A full run repeats both (ours: 1 cold + 4 warm).
REPEATS = 5
# The bundled fixture's naive loop, which a quick run measures once (`Config.measured`).
NAIVE_BUNDLED = "naive loop, bundled fixture"

NAIVE_LOOP = r"""#!/usr/bin/env bash
# Naive bisection: install each release in turn with pip, run the repro, blame the first
# release whose RSS grew by more than THRESHOLD_KIB between the first and last sample.
set -u
INDEX_URL=$1; THRESHOLD_KIB=$2; PY=$3; REPRO=$4; WORK=$5; shift 5
for v in "$@"; do
  venv="$WORK/venv-$v"
  "$PY" -m venv "$venv" || exit 1
  if ! "$venv/bin/pip" install -q --index-url "$INDEX_URL" "leakyfixture==$v" >/dev/null 2>&1
  then
    echo "release $v: cannot install, skipped"; continue
  fi
  "$venv/bin/python" "$REPRO" >/dev/null &
  pid=$!
  first=""; last=""
  while kill -0 $pid 2>/dev/null; do
    rss=$(ps -o rss= -p $pid 2>/dev/null | tr -d ' ')
    if [ -n "$rss" ] && [ "$rss" -gt 0 ]; then [ -z "$first" ] && first=$rss; last=$rss; fi
    sleep 0.1
  done
  wait $pid
  delta=$(( last - first ))
  echo "release $v: last-first RSS $delta KiB"
  if [ $delta -gt "$THRESHOLD_KIB" ]; then echo "FIRST BAD: $v"; exit 0; fi
done
echo "FIRST BAD: none"
"""


def _cli() -> list[str]:
    exe = Path(sys.executable).with_name("bisect-cli")
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "service.cli"]


def bisect_cli(
    repro: Path,
    url: str,
    work: Path,
    uv_cache: Path | None,
    *,
    span: str = "1.0.0..1.0.9",
    expected: str = EXPECTED,
    extra: tuple[str, ...] = (),
) -> dict[str, Any]:
    """`bisect-cli run` on the fixture index at `url` (a fresh database under `work`)."""
    env = clean_env(BISECT_CACHE_DIR=str(work / "cache"), BISECT_DATA_DIR=str(work / "data"))
    if uv_cache is not None:
        env["UV_CACHE_DIR"] = str(uv_cache)
    # The release search alone, what the naive loop does too: the traced boundary runs
    # (--attribute, on by default) are measured by bench/stages.py.
    cmd = [*_cli(), "run", str(repro), "--package", "leakyfixture", "--range", span,
           "--index-url", url, "--json", "--no-attribute", *extra]  # fmt: skip
    with stopwatch() as w:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    try:
        report = json.loads(proc.stdout)
    except ValueError:
        raise RuntimeError(
            f"bisect-cli run gave no JSON (exit {proc.returncode}): {proc.stderr[-800:]}"
        ) from None
    first_bad = report.get("first_bad") if report.get("status") == "found" else None
    return {
        "wall_s": w["s"],
        "status": report.get("status"),
        "message": report.get("message"),
        "answer": first_bad,
        "right": first_bad == expected,
        "runs": report.get("trials"),
        "installs": sum(1 for c in report.get("candidates", []) if c.get("trials")),
        "early_stop": "--no-early-stop" not in extra,
        "stopped_early": sum(
            1 for e in report.get("evidence", []) for r in e["runs"] if r.get("stopped_early")
        ),
    }


def naive_loop(
    repro: Path, url: str, work: Path, versions: list[str], expected: str = EXPECTED
) -> dict[str, Any]:
    work.mkdir(parents=True, exist_ok=True)
    script = work / "naive.sh"
    script.write_text(NAIVE_LOOP)
    env = clean_env(PIP_CACHE_DIR=str(work / "pip-cache"))
    cmd = ["bash", str(script), url, str(NAIVE_THRESHOLD_KIB), sys.executable, str(repro),
           str(work / "venvs"), *versions]  # fmt: skip
    with stopwatch() as w:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    if proc.returncode != 0:
        raise RuntimeError(f"naive loop failed (exit {proc.returncode}): {proc.stderr[-800:]}")
    deltas = {
        m.group(1): int(m.group(2))
        for m in re.finditer(r"^release (\S+): last-first RSS (-?\d+) KiB$", proc.stdout, re.M)
    }
    skipped = re.findall(r"^release (\S+): cannot install", proc.stdout, re.M)
    m = re.search(r"^FIRST BAD: (\S+)$", proc.stdout, re.M)
    answer = m.group(1) if m and m.group(1) != "none" else None
    return {
        "wall_s": w["s"],
        "answer": answer,
        "right": answer == expected,
        "runs": len(deltas),
        "installs": len(deltas) + len(skipped),
        "deltas_kib": deltas,
        "skipped": skipped,
        "status": "answered" if answer else "no answer",
    }


def run(cfg: Config) -> dict[str, Any]:
    versions = list(FixtureSpec().versions)
    out: dict[str, Any] = {"title": "5. End to end", "runs": []}
    with reachable_tmpdir(prefix="bench-e2e-") as tmp:
        work = Path(tmp)
        wheels = build_fixture(work / "wheels")
        repros = [("bundled repro (40 steps)", REPRO)]
        if not cfg.quick:
            text = REPRO.read_text()
            if "\nSTEPS = 40\n" not in text:
                raise RuntimeError("service/example/repro.py no longer says STEPS = 40")
            short = work / "repro_36_steps.py"
            short.write_text(text.replace("\nSTEPS = 40\n", "\nSTEPS = 36\n"))
            repros.append(("same repro stopped at 36 steps (ends inside a spike)", short))
        with serve_index(wheels) as url:
            for k, (label, repro) in enumerate(repros):
                cold_dir = work / f"cli-cold-{k}"
                cfg.log(f"e2e: bisect-cli run, cold uv cache, {label}")
                cold = bisect_cli(repro, url, cold_dir, None)
                out["runs"].append({"repro": label, "how": "bisect-cli run, cold uv cache", **cold})
                warm_runs = cfg.pick(REPEATS - 1, 0) if k == 0 else 0
                for j in range(warm_runs):
                    cfg.log(f"e2e: bisect-cli run, warm uv cache, {label}, run {j + 1}")
                    warm = bisect_cli(
                        repro, url, work / f"cli-warm-{k}-{j}", cold_dir / "cache" / "uv"
                    )
                    how = f"bisect-cli run, warm uv cache (run {j + 1} of {warm_runs})"
                    out["runs"].append({"repro": label, "how": how, **warm})
                if k == 0:  # the same search with every trial run to its end
                    cfg.log(f"e2e: bisect-cli run --no-early-stop, warm uv cache, {label}")
                    off = bisect_cli(repro, url, work / f"cli-off-{k}", cold_dir / "cache" / "uv",
                                     extra=("--no-early-stop",))  # fmt: skip
                    how = "bisect-cli run --no-early-stop, warm uv cache"
                    out["runs"].append({"repro": label, "how": how, **off})
                repeats = cfg.pick(REPEATS, 1) if k == 0 else 1
                for j in range(repeats):
                    cfg.log(f"e2e: naive venv + pip loop, {label}, run {j + 1} of {repeats}")
                    naive = naive_loop(repro, url, work / f"naive-{k}-{j}", versions)
                    if cfg.quick and k == 0:
                        cfg.measured[NAIVE_BUNDLED] = naive
                    how = "naive loop: venv + pip, last − first RSS"
                    if repeats > 1:
                        how += f" (run {j + 1} of {repeats})"
                    out["runs"].append({"repro": label, "how": how, **naive})
        if not cfg.quick:
            out["long"] = run_long(work / "long", cfg.log)
    rows, naive_rows = _result_rows(out["runs"]), _naive_rows(out["runs"], versions)
    out["tables"] = [
        table(
            f"Finding the first bad release of leakyfixture 1.0.0..1.0.9 (truth: {EXPECTED})",
            [
                "repro",
                "how",
                "wall s",
                "answer",
                "right?",
                "runs",
                "early stop (runs stopped)",
                "releases installed",
                "tool's message",
            ],
            rows,
            "Runs: repro executions (ours re-runs inconclusive candidates up to 3 times and "
            "the boundary pair once). Wall time includes building every environment. "
            "Early stop: whether bisect-cli could end a run early (--no-early-stop: never) "
            "and how many of its runs it did end early.",
        ),  # fmt: skip
        table(
            "What the naive loop saw, per release",
            ["repro", "run", "release", "last − first RSS (MiB)", "naive call (> 8 MiB)"],
            naive_rows,
        ),
    ]
    if out.get("long"):
        out["tables"].append(_long_table(out["long"]))
    out["naive_loop_script"] = NAIVE_LOOP
    return out


def bundled_runs(runs: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The bundled repro's runs: (bisect-cli runs, naive-loop runs)."""
    main = [r for r in runs if r["repro"].startswith("bundled")]
    return (
        [r for r in main if r["how"].startswith("bisect-cli") and r.get("early_stop", True)],
        [r for r in main if r["how"].startswith("naive")],
    )


def mean_wall(runs: list[dict[str, Any]]) -> float:
    return sum(r["wall_s"] for r in runs) / len(runs)


def notes(res: dict[str, Any]) -> list[str]:
    """What the numbers say, from the stored results."""
    out = []
    runs = res["runs"]
    cli, naive = bundled_runs(runs)
    if cli and naive:
        cli_s, naive_s = mean_wall(cli), mean_wall(naive)
        warm = cli[1:]
        out.append(
            f"bisect-cli took {cli[0]['wall_s']:.0f} s with a cold uv cache"
            + (
                f" and {sum(r['wall_s'] for r in warm) / len(warm):.0f} s on average with a warm "
                "one"
                if warm
                else ""
            )
            + f"; it found {EXPECTED} in {sum(r['right'] for r in cli)} of {len(cli)} runs ("
            + ", ".join(f"{r['answer'] or r['status']} after {r['runs']} runs" for r in cli)
            + f"). The naive loop took {naive_s:.0f} s on average ({naive_s / cli_s:.1f}x "
            f"bisect-cli's average) and blamed {EXPECTED} in {sum(r['right'] for r in naive)} "
            f"of {len(naive)} runs (answers: "
            + ", ".join(r["answer"] or "none" for r in naive)
            + "). On a 10-release range the search itself saves little: most of the time "
            "difference is `python -m venv` + pip against uv (section 3)."
        )
        clean = [d for r in naive for v, d in r["deltas_kib"].items() if v < EXPECTED]
        if clean:
            over = sum(d > NAIVE_THRESHOLD_KIB for d in clean)
            out.append(
                "How close the naive loop is to a wrong answer: its clean releases grew "
                f"{min(clean) / 1024:.1f}–{max(clean) / 1024:.1f} MiB from first to last "
                f"sample against its {NAIVE_THRESHOLD_KIB // 1024} MiB threshold ("
                + (f"above it {over} time{'s' if over > 1 else ''}" if over else "never above it")
                + "). The first `ps` sample lands anywhere between bash's fork and the end of the "
                "imports, so that number moves from run to run, and a threshold picked by hand "
                "decides the answer."
            )
        failed = [r for r in cli if not r["right"]]
        if failed:
            out.append(
                "**Our misses**: "
                + "; ".join(f"{r['how']}: {r['status']}, “{r['message']}”" for r in failed)
                + ". The tool reported a range or an unjudgeable bound instead of blaming a "
                "release; a longer repro, or --repeats, trades time for certainty."
            )
    out += _early_notes(res)
    other = [r for r in runs if not r["repro"].startswith("bundled")]
    if other:
        parts = []
        for r in other:
            who = r["how"].split(":")[0].split(",")[0]
            if r["answer"] is None:
                parts.append(f"{who} gave no answer ({r.get('message') or r['status']})")
            else:
                verdict = "right" if r["right"] else "wrong"
                parts.append(f"{who} blamed {r['answer']} ({verdict})")
        ours = next((r for r in other if r["how"].startswith("bisect-cli")), None)
        why = ""
        if ours is not None and ours["right"]:
            why = (
                " Ours judges the floor of the curve, so a spike held at the end does not move it."
            )
        elif ours is not None and ours["answer"] is None:
            why = " Ours did not blame a clean release; an unjudgeable bound asks for a longer run."
        out.append(
            "The same repro stopped at 36 steps, so that the run ends while a bounded 32 MiB "
            "spike is still held: " + "; ".join(parts) + "." + why
        )
    return out


def _early_notes(res: dict[str, Any]) -> list[str]:
    """Wall time with and without early stopping: the fixture, and the long repro."""
    out = []
    runs = [r for r in res["runs"] if r["repro"].startswith("bundled")]
    off = [r for r in runs if r.get("early_stop") is False]
    warm_on = [r for r in runs if r.get("early_stop") and "warm" in r["how"]]
    on = warm_on or [r for r in runs if r.get("early_stop")]
    if off and on:
        out.append(
            f"Early stopping on the fixture: {mean_wall(on):.0f} s with it "
            f"({'warm' if warm_on else 'cold'} uv cache, {on[0]['stopped_early']} runs stopped "
            f"early), {off[0]['wall_s']:.0f} s without (--no-early-stop, warm uv cache), "
            f"answers {on[0]['answer']} and {off[0]['answer']}. The fixture's runs take about "
            "2 s, so building environments dominates and the saving is small."
        )
    long = res.get("long")
    if long:
        full, early = long
        out.append(
            f"On the generated {LONG_S / 60:.0f}-minute repro the run to its end took "
            f"{full['duration_s']:.0f} s; with early stopping it ended after "
            f"{early['duration_s']:.0f} s ({early['stopped_early'] or 'not stopped'}): a "
            "leaking trial costs about half its run once a full run gives the horizon."
        )
    return out


def _result_rows(runs: list[dict[str, Any]]) -> list[list[Any]]:
    rows = []
    for r in runs:
        answer = r["answer"] or "none"
        rows.append(
            [r["repro"], r["how"], secs(r["wall_s"]), answer,
             "yes" if r["right"] else ("no answer" if r["answer"] is None else "**wrong**"),
             r["runs"], _early(r), r["installs"], r.get("message") or r["status"]]
        )  # fmt: skip
    return rows


def _early(r: dict[str, Any]) -> str:
    if "early_stop" not in r:
        return "n/a"  # the naive loop, or results from before early stopping
    return f"on ({r['stopped_early']})" if r["early_stop"] else "off"


def _long_table(long: list[dict[str, Any]]) -> dict[str, Any]:
    return table(
        f"A generated repro with a {LONG_S / 60:.0f}-minute run (30 MiB/min leak), one run each",
        ["how", "script s", "exit", "stopped early"],
        [[r["how"], secs(r["duration_s"]), r["exit_code"], r["stopped_early"] or "no"]
         for r in long],  # fmt: skip
        "Without early stopping the run goes to its end and is the horizon; with it, the "
        "same run under the settings the service then sends (contract/earlystop.py).",
    )


def _naive_rows(runs: list[dict[str, Any]], versions: list[str]) -> list[list[Any]]:
    """What the naive loop saw per release (only its runs carry `deltas_kib`)."""
    rows = []
    for r in runs:
        for v in versions if "deltas_kib" in r else ():
            if v in r["deltas_kib"]:
                d = r["deltas_kib"][v]
                call = "leak" if d > NAIVE_THRESHOLD_KIB else "clean"
                rows.append([r["repro"], r["how"], v, f"{d / 1024:.1f}", call])
            elif v in r["skipped"]:
                rows.append([r["repro"], r["how"], v, "n/a", "cannot install, skipped"])
    return rows
