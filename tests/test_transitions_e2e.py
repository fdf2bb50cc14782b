"""End to end: non-monotone ranges said out loud, --all-transitions, and releases a repro
cannot run on. Real uv, real child processes, `bisect-cli run --no-attribute`.

One generated index: leakyfixture leaks in 1.0.3-1.0.4 and again from 1.0.7 (no yanked,
foreign or pre-release), the shape of a library that turns a leaking default on, off and on
again; and 1.0.1 has no `leakyfixture.new_api()`, which the repro calls before its first
step marker, so the repro cannot run on 1.0.1: a skip inside a range (stepped around by
--all-transitions, which visits every release) and a bounds error as a good bound. Each
real bisection costs seconds per trial, so the scenarios share bisections where they can.
"""

import json
import sqlite3
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from rich.console import Console
from sqlmodel import Session

from service import store
from service.app import create_app
from service.cli.display import render_report
from service.db import get_engine
from service.example.fixture import FixtureSpec, build_fixture
from service.example.index import serve_index
from service.markdown import markdown_report
from service.models import Job
from service.report import build_report
from service.settings import Settings
from tests.test_run_e2e import EXAMPLE_REPRO, cli, run_args

NOT_MONOTONE = (
    "not monotone: 1.0.3 and 1.0.4 leak, 1.0.6 does not, 1.0.9 leaks again; "
    "map every transition with --all-transitions"
)
NEW_API_REPRO = """\
import time

import leakyfixture

leakyfixture.new_api()  # before the first step marker: a release without it cannot run this
for _ in range(40):
    leakyfixture.step()
    print("::leakbisect-step::", flush=True)
    time.sleep(0.05)
"""
MISSING = "AttributeError: module 'leakyfixture' has no attribute 'new_api'"


@pytest.fixture(scope="module")
def twice_index(reachable_dir: Callable[[str], Path]) -> Iterator[str]:
    spec = FixtureSpec(
        leak_ranges=(("1.0.3", "1.0.4"), ("1.0.7", None)),
        yanked={},
        foreign_only=None,
        prerelease=None,
        lacks_new_api=("1.0.1",),
    )
    with serve_index(build_fixture(reachable_dir("twice-wheels"), spec)) as url:
        yield url


@pytest.fixture(scope="module")
def repro(reachable_dir: Callable[[str], Path]) -> Path:
    script = reachable_dir("twice-repro") / "repro.py"
    script.write_text(NEW_API_REPRO)
    return script


def visited(db: Path) -> list[tuple[str, str]]:
    with sqlite3.connect(db) as con:
        return con.execute(
            "select c.version, t.verdict from trial t join candidate c on c.id = t.candidate_id "
            "where t.kind = 'run' order by t.id"
        ).fetchall()


def check_visits(ran: list[tuple[str, str]], expected: list[tuple[str, str]]) -> None:
    """What the search visited, against `expected` (each release and evaluation once).

    With two trials at a time in one process, a busy moment in the other trial's thread
    can hold the sampler off for 0.1-0.2 s (seen on a loaded machine: a gap in the last
    block of a 2 s repro left 5 of 6 blocks usable); the classifier then honestly says
    inconclusive, and the planner runs that release again, which can also cost it one
    more evaluation (engine/planner.py rules 1 and 4, engine/analysis.py `needs_more`).
    So: every decisive run has its release's expected verdict, and each release has its
    expected number of decisive runs plus at most one per inconclusive run it had;
    without inconclusive runs the visits are exactly the expected ones.
    """
    want = dict(expected)
    decisive = [(v, w) for v, w in ran if w != "inconclusive"]
    assert [(v, w) for v, w in decisive if w != want.get(v)] == [], ran
    extra = Counter(v for v, w in ran if w == "inconclusive")
    got, need = Counter(v for v, _ in decisive), Counter(v for v, _ in expected)
    off = {
        v: (got[v], need[v], extra[v]) for v in got | need if not 0 <= got[v] - need[v] <= extra[v]
    }
    assert off == {}, f"(decisive runs, expected, inconclusive) per release: {off}; {ran}"


def bisect(home: Path, uv_cache: Path, range_: str, index: str, script: Path, *extra: str):
    db = home / "results.db"
    args = run_args(range_, index, db, "--no-attribute", *extra, script=script)
    return cli(args, home, uv_cache), db


# --- a non-monotone range, by default --------------------------------------------------------


@pytest.fixture(scope="module")
def by_default(reachable_dir: Callable[[str], Path], twice_index: str, repro: Path, uv_cache: Path):
    home = reachable_dir("twice-default")
    proc, db = bisect(home, uv_cache, "1.0.0..1.0.9", twice_index, repro)
    return proc, db, home


def test_the_default_search_says_the_range_is_not_monotone(by_default) -> None:
    proc, db, _ = by_default
    assert proc.returncode == 0, proc.stderr  # found: the first transition is confirmed
    report = json.loads(proc.stdout)
    assert (report["status"], report["last_good"], report["first_bad"]) == (
        "found",
        "1.0.2",
        "1.0.3",
    )
    # Bounds; 1.0.4 (leak), 1.0.2, 1.0.3; the pair again; then the witness: the middle of
    # the untested 1.0.5-1.0.8 above the first bad, which does not leak.
    assert visited(db) == [
        ("1.0.0", "clean"), ("1.0.9", "leak"), ("1.0.4", "leak"), ("1.0.2", "clean"),
        ("1.0.3", "leak"), ("1.0.2", "clean"), ("1.0.3", "leak"), ("1.0.6", "clean"),
    ]  # fmt: skip
    assert report["not_monotone"] == NOT_MONOTONE
    assert report["disagree"] == ["1.0.6"]
    assert report["transitions"] == [
        {"before": "1.0.2", "after": "1.0.3", "change": "starts leaking", "confirmed": True,
         "between": []},
        {"before": "1.0.4", "after": "1.0.6", "change": "stops leaking", "confirmed": False,
         "between": ["1.0.5"]},
        {"before": "1.0.6", "after": "1.0.9", "change": "starts leaking", "confirmed": False,
         "between": ["1.0.7", "1.0.8"]},
    ]  # fmt: skip
    assert report["message"].splitlines()[:2] == [
        "first bad is 1.0.3 and last good is 1.0.2, each confirmed by a second evaluation",
        NOT_MONOTONE,
    ]


def test_text_and_markdown_say_it_in_their_first_lines(by_default) -> None:
    """The text report and the Markdown, rendered from the stored job as `bisect-cli report`
    renders them (in this process: two CLI starts would cost seconds)."""
    proc, db, _ = by_default
    assert proc.returncode == 0, proc.stderr
    with Session(get_engine(f"sqlite:///{db}")) as session:
        job = session.get(Job, 1)
        assert job is not None
        report = build_report(job, store.candidates_of(session, job), store.trials_of(session, job))
    console = Console(record=True, width=200)
    render_report(console, report, {})
    assert console.export_text().splitlines()[:7] == [
        "leakyfixture: first bad is 1.0.3, last good is 1.0.2",
        "first bad is 1.0.3 and last good is 1.0.2, each confirmed by a second evaluation",
        NOT_MONOTONE,
        "transitions:",
        "  starts leaking at 1.0.3, after 1.0.2",
        "  stops leaking at one of 1.0.5, 1.0.6, after 1.0.4, not re-run to confirm",
        "  starts leaking at one of 1.0.7, 1.0.8, 1.0.9, after 1.0.6, not re-run to confirm",
    ]
    md = markdown_report(report)
    assert md.splitlines()[2:9] == [
        "**first bad 1.0.3, last good 1.0.2, confirmed twice**",
        "",
        "Bisected `leakyfixture` over 1.0.0..1.0.9 for the first leaking release: 8 runs of "
        "the repro script, job 1.",
        "",
        "first bad is 1.0.3 and last good is 1.0.2, each confirmed by a second evaluation",
        "",
        f"**{NOT_MONOTONE}**",
    ]
    assert (
        "Transitions:\n\n- starts leaking at 1.0.3, after 1.0.2\n"
        "- stops leaking at one of 1.0.5, 1.0.6, after 1.0.4, not re-run to confirm\n"
        "- starts leaking at one of 1.0.7, 1.0.8, 1.0.9, after 1.0.6, not re-run to confirm\n"
    ) in md


def test_the_page_says_it(by_default, tmp_path: Path) -> None:
    proc, db, _ = by_default
    assert proc.returncode == 0, proc.stderr
    settings = Settings(
        database_url=f"sqlite:///{db}", data_dir=tmp_path / "data", cache_dir=tmp_path / "c",
        reap_interval_s=0, trusted_hosts=["testserver"],
    )  # fmt: skip
    with TestClient(create_app(settings)) as client:
        page = client.get("/jobs/1")
    assert page.status_code == 200, page.text
    assert NOT_MONOTONE in page.text
    assert (
        '<ul class="transitions" id="transitions"><li>starts leaking at 1.0.3, after 1.0.2</li>'
        in (page.text)
    )


# --- --all-transitions ----------------------------------------------------------------------


def test_all_transitions_maps_the_range_around_a_release_it_cannot_run(
    reachable_dir: Callable[[str], Path], twice_index: str, repro: Path, uv_cache: Path
) -> None:
    # Two trials at a time (--jobs 2): the order then depends on which finishes first, but
    # what runs does not: every release once, then both sides of each of the three
    # transitions once more, 10 + 2 x 3 runs (engine/planner.py, rules 3 and 4). 1.0.1
    # crashes on import before its first step marker: a skip, run once, stepped around.
    proc, db = bisect(reachable_dir("twice-all"), uv_cache, "1.0.0..1.0.9", twice_index,
                      repro, "--all-transitions", "--jobs", "2")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    leaking = ["1.0.3", "1.0.4", "1.0.7", "1.0.8", "1.0.9"]
    verdict = {"1.0.1": "skip"} | dict.fromkeys(leaking, "leak")
    twice = ["1.0.2", "1.0.3", "1.0.4", "1.0.5", "1.0.6", "1.0.7"]
    expected = [(v, verdict.get(v, "clean")) for v in [f"1.0.{i}" for i in range(10)] + twice]
    ran = visited(db)
    check_visits(ran, expected)
    assert [v for v, _ in ran[:2]] == ["1.0.0", "1.0.9"]  # the bounds first
    assert (report["status"], report["last_good"], report["first_bad"]) == (
        "found",
        "1.0.2",
        "1.0.3",
    )
    rows = [(t["before"], t["after"], t["change"], t["confirmed"]) for t in report["transitions"]]
    assert rows == [
        ("1.0.2", "1.0.3", "starts leaking", True),
        ("1.0.4", "1.0.5", "stops leaking", True),
        ("1.0.6", "1.0.7", "starts leaking", True),
    ]
    assert report["disagree"] == ["1.0.5", "1.0.6"]
    assert report["not_monotone"] == (
        "not monotone: 1.0.3 and 1.0.4 leak, 1.0.5 and 1.0.6 do not, 1.0.7 to 1.0.9 leak again"
    )
    # Never blamed: a skip that says why, in the JSON's candidates and the skipped list.
    row = next(c for c in report["candidates"] if c["version"] == "1.0.1")
    assert (row["verdict"], row["error"]) == ("skip", MISSING)
    assert report["skipped"] == ["1.0.1"]


# --- --all-transitions over a range whose bounds agree (issue #35, item 5) ---------------------

BAND_NOT_MONOTONE = "not monotone: 1.0.3 to 1.0.5 leak, 1.0.6 to 1.0.9 do not"


@pytest.fixture(scope="module")
def band_index(reachable_dir: Callable[[str], Path]) -> Iterator[str]:
    """leakyfixture 1.0.0-1.0.9 leaking only in 1.0.3-1.0.5: a band, both ends clean."""
    spec = FixtureSpec(
        leak_ranges=(("1.0.3", "1.0.5"),), yanked={}, foreign_only=None, prerelease=None
    )
    with serve_index(build_fixture(reachable_dir("band-wheels"), spec)) as url:
        yield url


def test_all_transitions_maps_a_leaking_band_between_clean_bounds(
    reachable_dir: Callable[[str], Path], band_index: str, uv_cache: Path
) -> None:
    # Both bounds clean: a plain run refuses the range; --all-transitions maps it. Every
    # release once, then both sides of the two transitions once more: 10 + 2 x 2 runs
    # (engine/planner.py rules 1, 3, 4 and 6), two at a time.
    proc, db = bisect(reachable_dir("band-all"), uv_cache, "1.0.0..1.0.9", band_index,
                      EXAMPLE_REPRO, "--all-transitions", "--jobs", "2")  # fmt: skip
    assert proc.returncode == 0, proc.stderr  # found: the first transition is confirmed
    report = json.loads(proc.stdout)
    band = {"1.0.3", "1.0.4", "1.0.5"}
    twice = ["1.0.2", "1.0.3", "1.0.5", "1.0.6"]
    expected = [
        (v, "leak" if v in band else "clean") for v in [f"1.0.{i}" for i in range(10)] + twice
    ]
    ran = visited(db)
    check_visits(ran, expected)
    assert [v for v, _ in ran[:2]] == ["1.0.0", "1.0.9"]  # the bounds first
    assert (report["status"], report["last_good"], report["first_bad"]) == (
        "found",
        "1.0.2",
        "1.0.3",
    )
    assert report["transitions"] == [
        {"before": "1.0.2", "after": "1.0.3", "change": "starts leaking", "confirmed": True,
         "between": []},
        {"before": "1.0.5", "after": "1.0.6", "change": "stops leaking", "confirmed": True,
         "between": []},
    ]  # fmt: skip
    assert report["disagree"] == ["1.0.6", "1.0.7", "1.0.8", "1.0.9"]
    assert report["not_monotone"] == BAND_NOT_MONOTONE
    assert report["message"].splitlines()[:2] == [
        "first bad is 1.0.3 and last good is 1.0.2, each confirmed by a second evaluation",
        BAND_NOT_MONOTONE,
    ]
    assert sum(c["trials"] for c in report["candidates"]) == len(ran)


def test_a_plain_run_of_the_band_points_at_all_transitions(
    reachable_dir: Callable[[str], Path], band_index: str, uv_cache: Path
) -> None:
    proc, db = bisect(reachable_dir("band-plain"), uv_cache, "1.0.0..1.0.9", band_index,
                      EXAMPLE_REPRO)  # fmt: skip
    assert proc.returncode == 3, proc.stderr  # bounds_failed
    report = json.loads(proc.stdout)
    assert report["status"] == "bounds_failed"
    assert report["message"].splitlines()[0] == (
        "bad bound 1.0.9 does not leak (clean): nothing to bisect; "
        "to map a range whose bounds agree, use --all-transitions"
    )
    check_visits(visited(db), [("1.0.0", "clean"), ("1.0.9", "clean")])


def test_a_map_without_a_transition_says_so(
    reachable_dir: Callable[[str], Path], band_index: str, uv_cache: Path
) -> None:
    proc, db = bisect(reachable_dir("band-none"), uv_cache, "1.0.6..1.0.9", band_index,
                      EXAMPLE_REPRO, "--all-transitions")  # fmt: skip
    assert proc.returncode == 3, proc.stderr  # bounds_failed: no transition
    report = json.loads(proc.stdout)
    assert (report["status"], report["transitions"]) == ("bounds_failed", [])
    assert report["message"].splitlines()[0] == (
        "no transition: every one of the 4 releases tested is clean (1.0.6 .. 1.0.9)"
    )
    # Bounds first, then the interior, each once.
    check_visits(visited(db), [(f"1.0.{i}", "clean") for i in (6, 9, 7, 8)])


# --- a bound the repro cannot run on ---------------------------------------------------------


def test_a_bound_the_repro_cannot_run_on_is_one_clear_line(
    reachable_dir: Callable[[str], Path], twice_index: str, repro: Path, uv_cache: Path
) -> None:
    proc, db = bisect(reachable_dir("twice-bound"), uv_cache, "1.0.1..1.0.9", twice_index, repro)
    assert proc.returncode == 1, proc.stderr  # error: a bound that cannot be tested
    report = json.loads(proc.stdout)
    assert report["status"] == "error"
    assert report["message"].splitlines() == [
        f"good bound 1.0.1 cannot be tested: the repro cannot run on it ({MISSING})",
        "hint: this release of leakyfixture has no new_api, which the repro uses: start the "
        "range at a release that has it",
    ]
    assert visited(db) == [("1.0.1", "skip")]
    run = report["evidence"][0]["runs"][0]
    assert (run["verdict"], run["exit_code"], run["error"]) == ("skip", 1, MISSING)


# --- the option reaches the job through the API ------------------------------------------------


def test_the_api_takes_all_transitions(tmp_path: Path, twice_index: str) -> None:
    settings = Settings(
        database_url=f"sqlite:///{tmp_path / 'api.db'}", data_dir=tmp_path / "data",
        cache_dir=tmp_path / "cache", reap_interval_s=0, trusted_hosts=["testserver"],
    )  # fmt: skip
    body = {"package": "leakyfixture", "range": "1.0.0..1.0.9", "script": "print(1)\n",
            "index_url": twice_index}  # fmt: skip
    with TestClient(create_app(settings)) as client:
        created = client.post("/api/v1/jobs", json={**body, "all_transitions": True})
        assert created.status_code == 201, created.text
        plain = client.post("/api/v1/jobs", json=body)
        assert plain.status_code == 201, plain.text
        refused = client.post("/api/v1/jobs", json={**body, "all_transitions": "sometimes"})
        assert refused.status_code == 422
        assert refused.json()["detail"].startswith("all_transitions: ")
    with Session(get_engine(settings.effective_database_url)) as session:
        jobs = [session.get(Job, created.json()["id"]), session.get(Job, plain.json()["id"])]
        assert [j.all_transitions for j in jobs if j is not None] == [True, False]
