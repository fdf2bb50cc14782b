"""The text report drawn from the report dict."""

import io

from rich.console import Console

from service.cli.display import render_report, sparkline
from service.markdown import markdown_report
from service.schemas import Report


def report(**fields) -> dict:
    base = {
        "job_id": 1,
        "range": "1.0.0..1.0.9",
        "status": "found",
        "find_fix": False,
        "package": "leakyfixture",
        "message": None,
        "last_good": "1.0.5",
        "first_bad": "1.0.6",
        "candidates": [],
        "evidence": [],
        "dependency_diff": [],
        "machine": None,
        "reproduce": None,
    }
    return {**base, **fields}


def text(rep: dict) -> str:
    out = io.StringIO()
    render_report(Console(file=out, width=200, no_color=True), Report.model_validate(rep), {})
    return out.getvalue()


def test_found_headline() -> None:
    assert text(report()).splitlines()[0] == "leakyfixture: first bad is 1.0.6, last good is 1.0.5"


def test_find_fix_headline() -> None:
    rep = report(find_fix=True, last_bad="2.0", first_good="2.1")
    assert text(rep).splitlines()[0] == "leakyfixture: first good is 2.1, last bad is 2.0"


def test_clean_bad_bound_gets_a_hint() -> None:
    message = "bad bound 1.0.6 does not leak (clean): nothing to bisect"
    lines = text(report(status="bounds_failed", message=message)).splitlines()
    assert lines[:3] == [
        "leakyfixture: bounds failed",
        message,
        "hint: a leak that grows less than the threshold during one run counts as clean; run "
        "the repro longer (more steps) or lower --min-growth",
    ]


def test_a_map_with_no_transition_says_so_first() -> None:
    """--all-transitions over a range that never changes (engine/planner.py rule 6): its
    line leads every report, and a clean map gets the same hint as a clean bad bound."""
    clean = "no transition: every one of the 10 releases tested is clean (1.0.0 .. 1.0.9)"
    rep = report(status="bounds_failed", message=clean, last_good=None, first_bad=None)
    lines = text(rep).splitlines()
    assert lines[:3] == [
        "leakyfixture: bounds failed",
        clean,
        "hint: a leak that grows less than the threshold during one run counts as clean; run "
        "the repro longer (more steps) or lower --min-growth",
    ]
    assert markdown_report(Report.model_validate(rep)).splitlines()[2] == f"**{clean}**"
    leaking = "no transition: every one of the 10 releases tested leaks (1.0.0 .. 1.0.9)"
    rep = report(status="bounds_failed", message=leaking, last_good=None, first_bad=None)
    assert "hint:" not in text(rep)


def test_an_unconfirmed_bound_is_the_headline() -> None:
    message = (
        "bad bound 1.0.9 is unconfirmed: its evaluations were leak, inconclusive, "
        "inconclusive; its re-runs decided nothing, pooled or alone"
    )
    rep = report(status="inconclusive", message=message, last_good=None, first_bad=None)
    assert markdown_report(Report.model_validate(rep)).splitlines()[2] == (
        f"**inconclusive: {message}**"
    )


def test_a_failed_bound_shows_no_dependency_diff() -> None:
    """No boundary pair, nothing to compare: the old report said "between None and None"."""
    evidence = [{"version": "0.11.19", "verdict": "clean", "runs": []}]
    rep = report(status="bounds_failed", last_good=None, first_bad=None, evidence=evidence)
    assert "package changed" not in text(rep)
    assert "no other package changed between 1.0.5 and 1.0.6" in text(report(evidence=evidence))


def test_sparkline_shows_floors() -> None:
    assert sparkline([0, 1, 2, 3, 4, 5, 6, 7], width=8) == "▁▂▃▄▅▆▇█"
    assert sparkline([]) == ""


RUNNING = {
    "trial": 2, "trial_id": 5, "version": "1.0.9", "runner": "r-1", "attempt": 1,
    "started_at": "2026-12-07T03:00:00Z", "elapsed_s": 12.2, "rss": 12 * 2**20, "steps": 7,
    "floor_first": 10 * 2**20, "floor": 11 * 2**20, "early_stop": "cap only",
}  # fmt: skip
JOB = {
    "package": "leakyfixture",
    "status": "running",
    "candidates": [
        {"version": "1.0.0", "verdict": "clean", "testable": True, "trials": 1},
        {"version": "1.0.9", "verdict": None, "testable": True, "trials": 0},
    ],
    "progress": {"trials_done": 1, "trials_running": 1, "trials_queued": 0, "running": [RUNNING]},
}


def test_submit_progress_shows_the_running_trials_status_line() -> None:
    """The same line as `run`'s (`status_line`), from the server's `progress.running`, then
    which trial and runner it is."""
    from service.cli.display import JobProgress

    out = io.StringIO()
    console = Console(file=out, width=200, no_color=True)
    progress = JobProgress(console, live=False)
    progress.report = JOB
    console.print(progress._render())
    lines = out.getvalue().splitlines()
    assert lines[1] == " C  ▶ "
    assert lines[2] == (
        "▶ 1.0.9  elapsed 12s  7 steps  12 MiB, floor 10→11  early stop: cap only  (trial 2, r-1)"
    )


def test_submit_progress_without_a_terminal_is_plain_lines_every_5_s() -> None:
    from service.cli.display import PLAIN_EVERY_S, JobProgress

    out = io.StringIO()
    progress = JobProgress(Console(file=out, width=200, no_color=True), live=False)
    progress.update(JOB)
    progress.update(JOB)  # polled again at once: nothing new to say
    progress.printed -= PLAIN_EVERY_S  # as if 5 s had passed since
    progress.update(JOB)
    assert out.getvalue().splitlines() == [
        "  1.0.0: clean (1 trials)",
        "running: trials: 1 done, 1 running, 0 queued",
        "running 1.0.9 (trial 2, r-1)",
        "  1.0.9  elapsed 12s  7 steps  12 MiB, floor 10→11  early stop: cap only  (trial 2, r-1)",
    ]


def test_run_names_what_a_from_to_job_searches() -> None:
    """`run`'s first line: a --from/--to job has no releases yet, only its changes."""
    from service.cli.run import _searched
    from service.models import Job

    job = Job(package="", good="good.txt", bad="bad.txt", script="pass", script_sha256="x",
              dependency={"changes": [{"name": "a"}, {"name": "b"}, {"name": "c"}]})  # fmt: skip
    assert _searched(None, job) == "3 packages changed between --from and --to"  # type: ignore[arg-type]
