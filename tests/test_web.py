"""The status page against a real `bisect-cli serve` (uvicorn, SQLite): every job state,
fragments, SSE, escaping, downsampling, the no-JavaScript cancel flow, the Markdown report
(API and CLI) and the re-run actions. Plain HTTP (httpx), as a browser without JavaScript.
"""

import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlmodel import Session, select

from service.db import get_engine
from service.models import Job, JobStatus, Trial, TrialStatus, utcnow
from service.web.render import CSP
from service.web.views import MAX_POINTS
from tests.test_cli_service import REPRO
from tests.web_support import (
    CLI,
    HOSTILE_LOG,
    HOSTILE_REQ,
    add_job,
    add_samples,
    copy_db,
    example_db,
    service_env,
    serving,
)


class Site:
    def __init__(self, url: str, db_url: str, ids: dict[str, int], example: dict[str, Any]):
        self.url, self.db_url, self.ids, self.example = url, db_url, ids, example
        self.http = httpx.Client(base_url=url, timeout=30)

    def get(self, path: str, **kw: Any) -> httpx.Response:
        return self.http.get(path, **kw)

    def csrf(self) -> str:
        self.get("/")
        return self.http.cookies["lb_csrf"]


STATES = {
    "queued": dict(status=JobStatus.QUEUED),
    "running": dict(status=JobStatus.RUNNING, verdicts={"1.0": "clean"}, leased="1.3"),
    "found": dict(
        status=JobStatus.FOUND,
        verdicts={"1.0": "clean", "1.1": "clean", "1.2": "leak", "1.3": "leak"},
        result={"status": "found", "last_old": "1.1", "first_new": "1.2", "skipped": []},
        message="first bad is 1.2 and last good is 1.1",
    ),
    "bounds_failed": dict(
        status=JobStatus.BOUNDS_FAILED,
        verdicts={"1.0": "leak"},
        message="the good bound 1.0 leaks: start the range earlier",
    ),
    "inconclusive": dict(
        status=JobStatus.INCONCLUSIVE,
        verdicts={"1.0": "clean", "1.1": "skip", "1.2": "untestable", "1.3": "leak"},
        result={
            "status": "inconclusive",
            "last_old": "1.0",
            "first_new": "1.3",
            "skipped": ["1.1", "1.2"],
        },
        message="only skipped releases separate 1.0 and 1.3",
    ),
    "find_fix": dict(
        status=JobStatus.FOUND,
        find_fix=True,
        verdicts={"1.0": "leak", "1.1": "leak", "1.2": "clean"},
        result={"status": "found", "last_old": "1.1", "first_new": "1.2", "skipped": []},
    ),
    "cancelled": dict(status=JobStatus.CANCELLED, message="cancelled on request"),
    "error": dict(status=JobStatus.ERROR, message="the planner failed: boom"),
}
# A --from/--to job with --commits as the scheduler stores it (tests/test_stages_e2e.py
# runs the real thing), and the lines its page shows (engine/findings.py).
SHA = "adedb82cd3a3c9216e1c69a1322f217e98eae938"
STAGES = dict(
    versions=("1.0", "1.1"),
    verdicts={"1.0": "clean", "1.1": "leak"},
    result={"status": "found", "last_old": "1.0", "first_new": "1.1", "skipped": []},
    stored={
        "dependency": {
            "changes": [{"name": "demo-pkg", "old": "1.0", "new": "1.1"},
                        {"name": "other", "old": "2.0", "new": "3.0"}],
            "mixes": [{"label": "--from env", "verdict": "clean"},
                      {"label": "--to env", "verdict": "leak"},
                      {"label": "mix: demo-pkg 1.1", "verdict": "leak"}],
            "worst_case_mixes": 4,
            "culprits": [{"name": "demo-pkg", "old": "1.0", "new": "1.1"}],
            "certified": True,
            "message": "leaks when demo-pkg 1.0 -> 1.1 is applied",
        },
        "commit": {
            "repo": "https://example.invalid/demo.git", "status": "found", "commits": 4,
            "first_bad": {"sha": SHA, "subject": "cache <frames>"},
            "last_good": {"sha": "c" * 40, "subject": "tidy"},
            "unbuildable": [],
            "message": f"first leaking commit: {SHA[:12]} cache <frames>",
        },
        "attribute": False,
    },
)  # fmt: skip
STAGE_LINES = {
    "dependency": [
        "2 packages changed between --from and --to; 3 mixes judged (at most 4 for 2 changes)",
        "leaks when demo-pkg 1.0 -&gt; 1.1 is applied",
        "certified 1-minimal: removing any one culprit makes it clean",
        "  --from env: clean (0 trials)",
    ],
    "commit": [
        f"first leaking commit: {SHA[:12]} cache &lt;frames&gt;",
        "  repository: https://example.invalid/demo.git",
        f"  last good: {'c' * 40} tidy",
        f"  first bad: {SHA} cache &lt;frames&gt;",
        "  4 commits between the two tags, both tags included",
    ],
}
BANNERS = {
    "queued": "queued: no answer yet",
    "running": "running: no answer yet",
    "found": "first bad 1.2, last good 1.1",
    "bounds_failed": "a bound failed its check: the good bound 1.0 leaks: start the range earlier",
    "inconclusive": "inconclusive: only unjudgeable releases separate the pair (1.1, 1.2)",
    "find_fix": "first good 1.2, last bad 1.1",
    "cancelled": "cancelled: cancelled on request",
    "error": "error: the planner failed: boom",
}


@pytest.fixture(scope="module")
def site(
    tmp_path_factory: pytest.TempPathFactory, reachable_dir: Any, uv_cache: Path
) -> Iterator[Site]:
    home = tmp_path_factory.mktemp("web")
    # The page shows a job in every state, 30 of them queued or running for the one
    # tokenless owner: above the default per-owner limit, which test_owner_limits tests.
    env = service_env(home, reachable_dir, uv_cache, BISECT_MAX_ACTIVE_JOBS="100")
    db, report = example_db(reachable_dir("web-example"), env)
    url = copy_db(db, home / "web.db")
    ids = {name: add_job(url, **kw) for name, kw in STATES.items()}  # type: ignore[arg-type]
    ids["hostile"] = add_job(
        url,
        JobStatus.FOUND,
        verdicts={"1.0": "clean", "1.3": "leak"},
        log_tail=HOSTILE_LOG,
        requirements=[HOSTILE_REQ],
        package="evil-pkg",
        result={"status": "found", "last_old": "1.0", "first_new": "1.3", "skipped": []},
    )
    ids["stages"] = add_job(url, JobStatus.FOUND, **STAGES)  # type: ignore[arg-type]
    ids["example"] = report["job_id"]
    with serving(home, env, url) as svc:
        yield Site(svc.url, url, ids, report)


def answer(html: str) -> str:
    found = re.search(r'<strong id="answer">(.*?)</strong>', html, re.S)
    assert found, html[:2000]
    return found.group(1).strip()


def cells(html: str) -> dict[str, str]:
    return dict(re.findall(r'data-version="([^"]+)" data-letter="([^"]+)"', html))


def test_every_state_renders_its_banner_without_javascript(site: Site) -> None:
    for name, banner in BANNERS.items():
        r = site.get(f"/jobs/{site.ids[name]}")
        assert r.status_code == 200
        assert r.headers["content-security-policy"] == CSP
        assert answer(r.text) == banner.replace("'", "&#39;")
        assert f'class="badge s-{STATES[name]["status"].value}"' in r.text
    running = site.get(f"/jobs/{site.ids['running']}").text
    assert cells(running) == {"1.0": "C", "1.1": "·", "1.2": "·", "1.3": "▶"}
    assert "▶ 1.3 (trial" in running and "123.0 MiB" in running
    assert 'id="cancel" href="/jobs/' in running  # an open job can be cancelled
    inconclusive = site.get(f"/jobs/{site.ids['inconclusive']}").text
    assert cells(inconclusive) == {"1.0": "C", "1.1": "S", "1.2": "×", "1.3": "L"}
    assert 'id="cancel"' not in inconclusive
    fixed = site.get(f"/jobs/{site.ids['find_fix']}").text
    assert '<span class="bound">first good</span>' in fixed
    assert '<span class="bound">last bad</span>' in fixed


def test_the_example_job_page(site: Site) -> None:
    job = site.ids["example"]
    html = site.get(f"/jobs/{job}").text
    assert answer(html) == "first bad 1.0.6, last good 1.0.5, confirmed twice"
    assert cells(html) == {
        "1.0.0": "C",
        "1.0.1": "·",
        "1.0.2": "·",
        "1.0.3": "·",
        "1.0.4": "×",
        "1.0.5": "C",
        "1.0.6": "L",
        "1.0.7": "L",
        "1.0.8": "·",
        "1.0.9": "L",
    }
    assert '<h2>Release 1.0.6: <span class="verdict v-leak">leaks</span></h2>' in html
    assert html.count('class="curve" data-curve=') == 2  # the first bad ran twice
    assert "Dependency diff between 1.0.5 and 1.0.6: 1 other package changed" in html
    # --attribute (on by default): the traced boundary pair's growing stack, by tracemalloc.
    traced = section(html, "attribution")
    assert traced.startswith("<h2>Which allocation site</h2>")
    assert "stacks growing in 1.0.6 and not in 1.0.5 (tracing perturbs timing" in traced
    assert "leakyfixture/__init__.py:22 in _touched &lt;- leakyfixture" in traced
    assert 'id="dependency"' not in html and 'id="commit"' not in html
    assert 'title="yanked">Y</span>' in html  # 1.0.3
    selected = site.get(f"/jobs/{job}?candidate=1.0.0").text
    assert '<h2>Release 1.0.0: <span class="verdict v-clean">clean</span></h2>' in selected
    curve_url = re.search(r'data-curve="([^"]+)"', html).group(1)  # type: ignore[union-attr]
    curve = site.get(curve_url).json()
    assert curve["points"] == curve["samples"] == len(curve["t"]) == len(curve["rss"])
    assert len(curve["host"]["floors"]) >= 6 and len(curve["host"]["slope"]) == 2
    assert curve["steps"] and curve["gpu"] is None


def section(html: str, id_: str) -> str:
    found = re.search(rf'<section class="card" id="{id_}">\s*(.*?)</section>', html, re.S)
    assert found, f"no section {id_}"
    return found.group(1)


def test_the_stages_beyond_the_release_have_their_sections(site: Site) -> None:
    html = site.get(f"/jobs/{site.ids['stages']}").text
    dependency = section(html, "dependency")
    assert dependency.startswith("<h2>Which dependency</h2>")
    assert "\n".join(STAGE_LINES["dependency"]) in dependency
    commit = section(html, "commit")
    assert commit.startswith("<h2>Which commit</h2>")
    assert "\n".join(STAGE_LINES["commit"]) in commit
    assert 'id="attribution"' not in html  # --no-attribute


def test_fragments_and_list(site: Site) -> None:
    live = site.get(f"/jobs/{site.ids['found']}/fragments/live?candidate=1.2").text
    assert live.startswith('<div id="job-live" hx-get="/jobs/')
    assert 'hx-trigger="sse:changed, every 30s"' in live and "<html" not in live
    listing = site.get("/").text
    ids = [int(i) for i in re.findall(r'<tr id="job-row-(\d+)">', listing)]
    assert ids == sorted(ids, reverse=True) and len(ids) == len(site.ids)
    found_only = site.get("/?status=found").text
    # found, find_fix, hostile, stages and the example
    assert re.findall(r'<span class="badge s-(\w+)">', found_only) == ["found"] * 5
    evil = site.get("/fragments/jobs?package=EVIL_pkg").text  # PEP 503 comparison
    assert re.findall(r'<tr id="job-row-(\d+)">', evil) == [str(site.ids["hostile"])]
    assert "1.0.5 → 1.0.6" in listing and "5/10 judged" in listing


def test_pagination(site: Site) -> None:
    for _ in range(26):
        add_job(site.db_url, JobStatus.QUEUED, package="many-pkg")
    first = site.get("/?package=many-pkg").text
    assert (
        "26 jobs matching; page 1 of 2" in first
        and 'rel="next" href="/?package=many-pkg&amp;page=2"' in first
    )
    second = site.get("/?package=many-pkg&page=2").text
    assert len(re.findall(r'<tr id="job-row-', second)) == 1 and 'rel="prev"' in second


def test_hostile_text_is_escaped(site: Site) -> None:
    html = site.get(f"/jobs/{site.ids['hostile']}?candidate=1.3").text
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert "<script>alert" not in html and "\x1b" not in html and "red done" in html
    assert "&#34;&gt;&lt;img src=x onerror=alert(1)&gt;" in html
    assert "<img src=x" not in html
    md = site.get(f"/jobs/{site.ids['hostile']}/report.md").text
    # Inside a fenced block it is literal text; everywhere else it is escaped.
    outside = re.sub(r"```console\n.*?\n```", "", md, flags=re.S)
    assert "'\"><img src=x" in md and "<img" not in outside and "<script" not in outside
    scripts = re.findall(r"<script[^>]*>", html)
    assert scripts and all(
        re.fullmatch(r'<script src="/static/[\w./-]+\.js" defer>', s) for s in scripts
    )


def _read_events(url: str, out: list[str], stop: threading.Event) -> None:
    with httpx.stream("GET", url, timeout=30) as r:
        out.append(f"status {r.status_code} {r.headers['content-type']}")
        for line in r.iter_lines():
            out.append(line)
            if stop.is_set() or line.startswith("data:"):
                return


def _touch_trial(db_url: str, job_id: int, status: TrialStatus) -> None:
    with Session(get_engine(db_url)) as session:
        trial = session.exec(select(Trial).where(Trial.job_id == job_id)).first()
        assert trial is not None
        trial.status = status
        trial.started_at = utcnow()
        session.add(trial)
        session.commit()


@pytest.mark.parametrize(
    "path,expect",
    [("/events/jobs/{id}", "data: job {id} changed"), ("/events", "data: jobs changed")],
)
def test_sse_says_the_job_changed(site: Site, path: str, expect: str) -> None:
    job = add_job(site.db_url, JobStatus.RUNNING, verdicts={"1.0": "clean"})
    lines: list[str] = []
    stop = threading.Event()
    reader = threading.Thread(
        target=_read_events, args=(site.url + path.format(id=job), lines, stop)
    )
    reader.start()
    deadline = time.monotonic() + 30
    while not any(line == ": connected" for line in lines):
        assert time.monotonic() < deadline, f"stream did not open: {lines}"
        time.sleep(0.05)
    # A runner takes a trial. Touched again until the stream tells: the watcher's first
    # poll only records the state it finds, and a loaded machine may be slow to make it.
    for _ in range(15):
        _touch_trial(site.db_url, job, TrialStatus.LEASED)
        reader.join(2)
        if not reader.is_alive():
            break
    stop.set()
    reader.join(20)
    assert lines[0] == "status 200 text/event-stream; charset=utf-8"
    assert lines[-1] == expect.format(id=job)
    assert lines[-2] in ("event: changed", "event: jobs")


def test_downsampled_curve_keeps_spikes(site: Site) -> None:
    job = add_job(site.db_url, JobStatus.FOUND, verdicts={"1.0": "clean"})
    with Session(get_engine(site.db_url)) as session:
        trial = session.exec(select(Trial).where(Trial.job_id == job)).one()
    mib = 1024 * 1024
    rows = [
        {"t": i * 0.1, "rss": (100 + (i % 7)) * mib + (i // 1000) * mib, "step": i // 100}
        for i in range(360_000)
    ]
    for i in (1234, 99_999, 250_001):
        rows[i]["rss"] = (900 + i % 10) * mib  # spikes of one sample each
    add_samples(site.db_url, trial.id, rows)  # type: ignore[arg-type]
    # The curve's path names the trial by its number in the job, as the page shows it.
    curve = site.get(f"/jobs/{job}/trials/{trial.number}/curve.json").json()
    assert curve["samples"] == 360_000 and curve["points"] <= MAX_POINTS == 2000
    assert len(curve["t"]) == curve["points"]
    for i in (1234, 99_999, 250_001):
        assert round(i * 0.1, 3) in curve["t"]
        assert (900 + i % 10) in curve["rss"]
    assert min(curve["rss"]) == 100.0 and len(curve["steps"]) == 3600 // 8 == 450


def test_cancel_without_javascript(site: Site) -> None:
    job = add_job(site.db_url, JobStatus.RUNNING, verdicts={"1.0": "clean"}, leased="1.1")
    confirm = site.get(f"/jobs/{job}/cancel").text
    assert f'<form method="post" action="/jobs/{job}/cancel">' in confirm
    token = site.csrf()
    no_csrf = site.http.post(f"/jobs/{job}/cancel", data={})
    assert no_csrf.status_code == 403 and "CSRF token missing or wrong" in no_csrf.text
    other_site = site.http.post(
        f"/jobs/{job}/cancel", data={"csrf": token}, headers={"Origin": "http://evil.example"}
    )
    assert other_site.status_code == 403
    done = site.http.post(f"/jobs/{job}/cancel", data={"csrf": token})
    assert done.status_code == 303 and done.headers["location"] == f"/jobs/{job}"
    page = site.get(f"/jobs/{job}").text
    assert answer(page) == "cancelled: cancelled from the status page"
    again = site.http.post(f"/jobs/{job}/cancel", data={"csrf": token})
    assert again.status_code == 409 and f"job {job} has already finished (cancelled)" in again.text


def test_markdown_report_api_and_cli(site: Site) -> None:
    job = site.ids["example"]
    api = site.get(f"/api/v1/jobs/{job}/report.md")
    assert api.status_code == 200 and api.headers["content-type"] == "text/markdown; charset=utf-8"
    lines = api.text.splitlines()
    assert lines[0] == "### leakbisect: `leakyfixture` 1.0.0..1.0.9"
    assert lines[2] == "**first bad 1.0.6, last good 1.0.5, confirmed twice**"
    assert f"([status page and memory curves]({site.url}/jobs/{job}))" in lines[4]
    assert "| 1.0.6 | leak | 2 | " in api.text and "**first bad** |" in api.text
    assert "| 1.0.4 |  | 0 |  | untestable: no wheel for Python" in api.text
    assert "```console\nuv venv /tmp/leakbisect-repro && uv pip install" in api.text
    assert site.get(f"/jobs/{job}/report.md").text == api.text
    import subprocess

    cli = subprocess.run(
        CLI + ["report", str(job), "--local", "--markdown", "--database-url", site.db_url],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert cli.returncode == 0, cli.stderr
    # The same report; only the link to the page needs a server.
    assert cli.stdout == api.text.replace(
        f" ([status page and memory curves]({site.url}/jobs/{job}))", ""
    )
    missing = subprocess.run(
        CLI + ["report", "999", "--local", "--markdown", "--database-url", site.db_url],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert missing.returncode == 2 and missing.stderr.strip() == "error: job 999 not found"
    remote = subprocess.run(
        [*CLI, "report", str(job), "--markdown", "--server", site.url],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert remote.returncode == 0 and remote.stdout == api.text
    both = subprocess.run(
        CLI + ["report", "1", "--markdown", "--json"], capture_output=True, text=True
    )
    assert both.returncode == 2 and "--markdown: choose --markdown or --json" in both.stderr


def test_again_and_rerun(site: Site, fixture_index: str) -> None:
    body = {
        "package": "leakyfixture",
        "range": "1.0.0..1.0.9",
        "script": REPRO.read_text(),
        "index_url": fixture_index,
    }
    job = site.http.post("/api/v1/jobs", json=body).json()["id"]
    again = site.http.post(f"/api/v1/jobs/{job}/again", json={"repeats": 3})
    assert again.status_code == 201, again.text
    rerun = site.http.post(f"/api/v1/jobs/{job}/again", json={"candidate": "1.0.6"})
    assert rerun.status_code == 201, rerun.text
    bad = site.http.post(f"/api/v1/jobs/{job}/again", json={"candidate": "9.9"})
    assert (
        bad.status_code == 422
        and bad.json()["detail"] == f"candidate: release 9.9 is not a candidate of job {job}"
    )
    untestable = site.http.post(f"/api/v1/jobs/{job}/again", json={"candidate": "1.0.4"})
    assert untestable.json()["detail"] == "candidate: release 1.0.4 is untestable here"
    with Session(get_engine(site.db_url)) as session:
        first = session.get(Job, again.json()["id"])
        second = session.get(Job, rerun.json()["id"])
        assert first is not None and second is not None
        assert (first.good, first.bad, first.repeats, first.reuse_verdicts) == (
            "1.0.0",
            "1.0.9",
            3,
            False,
        )
        assert (second.good, second.bad, second.repeats) == ("1.0.5", "1.0.6", 2)
    # The page's form does the same and lands on the new job.
    token = site.csrf()
    form = site.http.post(
        f"/jobs/{job}/again", data={"csrf": token, "candidate": "1.0.0", "repeats": "1"}
    )
    assert form.status_code == 303 and re.fullmatch(r"/jobs/\d+", form.headers["location"])
    new_page = site.get(form.headers["location"]).text
    assert "<h1>Job" in new_page and '<span class="range">1.0.0..1.0.1</span>' in new_page
    worse = site.http.post(f"/jobs/{job}/again", data={"csrf": token, "repeats": "many"})
    assert worse.status_code == 422 and "repeats: a whole number from 1 to 20" in worse.text
    many = site.http.post(f"/jobs/{job}/again", data={"csrf": token, "repeats": "99"})
    assert many.status_code == 422
    assert "repeats: Input should be less than or equal to 20" in many.text


def test_again_on_a_from_to_job_starts_from_its_two_environments(site: Site) -> None:
    """The culprit a --from/--to job found is not an option: again asks the same question."""
    good, bad = "suite-alpha==0.4.0\nsuite-beta==2.0.0\n", "suite-alpha==0.4.3\nsuite-beta==2.0.4\n"
    body = {"script": "pass\n", "from_env": good, "to_env": bad, "from_env_name": "good.txt",
            "to_env_name": "bad.txt", "index_url": "http://127.0.0.1:9/simple"}  # fmt: skip
    job = site.http.post("/api/v1/jobs", json=body)
    assert job.status_code == 201, job.text
    with Session(get_engine(site.db_url)) as session:  # as the mix stage leaves it
        found = session.get(Job, job.json()["id"])
        assert found is not None
        found.package, found.good, found.bad = "suite-beta", "2.0.0", "2.0.4"
        session.add(found)
        session.commit()
    again = site.http.post(f"/api/v1/jobs/{job.json()['id']}/again", json={"repeats": 2})
    assert again.status_code == 201, again.text
    with Session(get_engine(site.db_url)) as session:
        new = session.get(Job, again.json()["id"])
        assert new is not None
        assert (new.from_env, new.to_env, new.package) == (good, bad, "")
        assert (new.good, new.bad, new.repeats) == ("good.txt", "bad.txt", 2)
    narrowed = site.http.post(f"/api/v1/jobs/{job.json()['id']}/again",
                              json={"candidate": "2.0.4"})  # fmt: skip
    assert narrowed.status_code == 422
    assert narrowed.json()["detail"] == (
        "candidate: a --from/--to job is bisected again whole, from its two environments"
    )


def test_pages_and_watcher_on_postgres(
    pg_url: str, tmp_path: Path, reachable_dir: Any, uv_cache: Path
) -> None:
    from service.web.events import fingerprints

    job = add_job(pg_url, JobStatus.RUNNING, verdicts={"1.0": "clean"}, leased="1.3")
    done = add_job(
        pg_url,
        JobStatus.FOUND,
        verdicts={"1.0": "clean", "1.3": "leak"},
        result={"status": "found", "last_old": "1.0", "first_new": "1.3", "skipped": []},
    )
    before = fingerprints(get_engine(pg_url))
    assert set(before) == {job, done}
    _touch_trial(pg_url, job, TrialStatus.DONE)
    after = fingerprints(get_engine(pg_url))
    assert after[job] != before[job] and after[done] == before[done]
    env = service_env(tmp_path, reachable_dir, uv_cache)
    with serving(tmp_path, env, pg_url) as svc:
        listing = httpx.get(f"{svc.url}/").text
        assert [int(i) for i in re.findall(r'<tr id="job-row-(\d+)">', listing)] == [done, job]
        assert "1.0 → 1.3" in listing and "1/4 judged, 1 running" in listing
        page = httpx.get(f"{svc.url}/jobs/{done}").text
        assert answer(page) == "first bad 1.3, last good 1.0"


def test_gpu_series_and_overlay_in_the_curve(site: Site) -> None:
    job = add_job(site.db_url, JobStatus.FOUND, verdicts={"1.0": "leak"})
    mib = 1024 * 1024
    with Session(get_engine(site.db_url)) as session:
        trial = session.exec(select(Trial).where(Trial.job_id == job)).one()
        trial.analysis = {
            **(trial.analysis or {}),
            "gpu": {
                "verdict": "leak",
                "unit": "MiB/s",
                "floors_mib": [100.0, 110.0],
                "floor_x": [2.0, 8.0],
                "slope": 5 / 3,
                "window": 9.0,
            },
        }
        trial.gpu_source = "nvml-process"
        session.add(trial)
        trial_id, number = trial.id, trial.number
        session.commit()
    rows = [{"t": i * 0.1, "rss": 50 * mib, "gpu": (100 + i // 10) * mib} for i in range(100)]
    add_samples(site.db_url, trial_id, rows)  # type: ignore[arg-type]
    curve = site.get(f"/jobs/{job}/trials/{number}/curve.json").json()
    assert curve["gpu"][0] == 100.0 and curve["gpu"][-1] == 109.0
    assert curve["gpu_overlay"]["floors"] == [[2.0, 100.0], [8.0, 110.0]]
    assert curve["gpu_overlay"]["slope"] == [[2.0, 100.0], [8.0, 110.0]]
    assert curve["gpu_overlay"]["judged_from"] == 0.9  # the last sample (9.9 s) - window
    page = site.get(f"/jobs/{job}").text
    assert "<tr><td>GPU</td><td>leak</td>" in page and "GPU nvml-process" in page
