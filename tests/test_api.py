"""The REST API on SQLite and on Postgres: submission, the runner protocol, leases, reuse.

No uv runs the repro here: a fake runner loop answers every lease over HTTP with a
report drawn from the fixture's ground truth (1.0.6 and later leak), so these tests
pin the service's exact path through a bisection. The real runner is tested elsewhere.
"""

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import text
from sqlmodel import Session, select

from contract.wire import EnvResult, TrialReport
from service.app import create_app
from service.db import get_engine, upgrade
from service.maintenance import tick
from service.models import Candidate, Job, PinState, Trial, TrialKind
from service.scheduler import advance, slots_for
from service.settings import Settings
from service.trials import record_report

API = "/api/v1"
MIB = 1024 * 1024
SCRIPT = "import leakyfixture\nfor _ in range(40):\n    leakyfixture.step()\n"
FIRST_LEAK = (1, 0, 6)
# One runner: both bounds, binary search stepping over the untestable 1.0.4, confirmation.
ONE_RUNNER_PATH = ["1.0.0", "1.0.9", "1.0.5", "1.0.7", "1.0.6", "1.0.5", "1.0.6"]


# --------------------------------------------------------------------------- fixtures


@pytest.fixture(params=["sqlite", "postgres"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'api.db'}"
    url = request.getfixturevalue("pg_url")
    upgrade(url)
    with get_engine(url).begin() as conn:  # one database per module: every test starts empty
        conn.execute(
            text("TRUNCATE memory_sample, trial, candidate, job, runner RESTART IDENTITY CASCADE")
        )
    return url


@pytest.fixture
def make_client(
    db_url: str, tmp_path: Path, uv_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> Callable[..., Any]:
    monkeypatch.setenv("UV_CACHE_DIR", str(uv_cache))

    @contextmanager
    def make(**overrides: Any) -> Iterator[TestClient]:
        fields: dict[str, Any] = {
            "database_url": db_url,
            "data_dir": tmp_path / "data",
            "cache_dir": tmp_path / "cache",
            "reap_interval_s": 0,  # tests reap by calling tick(), unless they want the thread
            "trusted_hosts": ["testserver"],  # the TestClient's Host
            **overrides,
        }
        with TestClient(create_app(Settings(**fields))) as client:
            yield client

    return make


@pytest.fixture
def client(make_client: Callable[..., Any]) -> Iterator[TestClient]:
    with make_client() as client:
        yield client


# ---------------------------------------------------------------------------- helpers


def body(index: str, **overrides: Any) -> dict[str, Any]:
    return {
        "package": "leakyfixture",
        "range": "1.0.0..1.0.9",
        "script": SCRIPT,
        "index_url": index,
        **overrides,
    }


def submit(client: TestClient, index: str, **overrides: Any) -> dict[str, Any]:
    """Submit, then settle the job's pins as a runner's resolve trial would (see
    `resolve_pins`): the tests below follow the bisection that comes after."""
    response = client.post(f"{API}/jobs", json=body(index, **overrides))
    assert response.status_code == 201, response.text
    created = response.json()
    resolve_pins(client, created["id"])
    return created


def resolve_pins(client: TestClient, job_id: int) -> None:
    """Record the job's resolve trial as done with the fixture's pins, and advance the job:
    what a runner's report does (test_resolve_trial_over_the_protocol drives it over HTTP),
    without a runner that would count as a free slot."""
    settings: Settings = client.app.state.settings  # type: ignore[attr-defined]
    with Session(get_engine(settings.effective_database_url)) as session:
        job = session.get(Job, job_id)
        assert job is not None
        if job.pin_state != PinState.PENDING:
            return
        trial = session.exec(
            select(Trial).where(Trial.job_id == job_id, Trial.kind == TrialKind.RESOLVE)
        ).one()
        candidate = session.get(Candidate, trial.candidate_id)
        assert candidate is not None
        pins = [f"leakyfixture=={candidate.version}"]
        ok = TrialReport(trial_id=trial.id, env=EnvResult(ok=True), pins=pins)
        record_report(session, job, candidate, trial, ok)
        advance(session, job, slots_for(session, job, within_s=settings.runner_live_s))


def job(client: TestClient, job_id: int) -> dict[str, Any]:
    response = client.get(f"{API}/jobs/{job_id}")
    assert response.status_code == 200, response.text
    return response.json()


# Each registered runner's secret, by runner id: the helpers below send it as the runner would.
SECRETS: dict[str, str] = {}


def as_runner(runner_id: str) -> dict[str, str]:
    return {"X-Runner-Secret": SECRETS.get(runner_id, "")}


def register(client: TestClient, name: str, gpus: int = 0) -> str:
    capabilities = {
        "gpus": [{"name": "H100", "memory_bytes": 80 << 30}] * gpus,
        "memory_bytes": 64 << 30,
        "cpus": 8,
        "pythons": ["3.12"],
    }
    response = client.post(
        f"{API}/runners",
        json={"name": name, "capabilities": capabilities, "labels": {"site": "test"}},
    )
    assert response.status_code == 201, response.text
    answer = response.json()
    assert answer["runner_id"].startswith("r-")
    SECRETS[answer["runner_id"]] = answer["runner_secret"]
    return answer["runner_id"]


def lease(client: TestClient, runner_id: str, wait: float = 0) -> dict[str, Any] | None:
    response = client.post(
        f"{API}/runners/{runner_id}/lease",
        params={"wait": wait},
        json={},
        headers=as_runner(runner_id),
    )
    if response.status_code == 204:
        return None
    assert response.status_code == 200, response.text
    return response.json()


def series(leaks: bool) -> list[dict[str, Any]]:
    """60 s at 2 Hz: +2 MiB/s for a leak, flat (with a little jitter) otherwise."""
    return [
        {"t": i * 0.5, "rss": int((500 + (i if leaks else 0) + (i * 7) % 5) * MIB)}
        for i in range(121)
    ]


def report(held: dict[str, Any], runner_id: str) -> dict[str, Any]:
    spec = held["trial"]
    version = spec["env"]["version"]
    if spec["kind"] == "resolve":  # the good bound's pins, as `uv pip compile` gives them
        pins = [f"leakyfixture=={version}"]
        ident = {"trial_id": spec["trial_id"], "attempt": spec["attempt"], "runner_id": runner_id}
        return {**ident, "env": {"ok": True}, "pins": pins}
    leaks = tuple(int(p) for p in version.split(".")) >= FIRST_LEAK
    return {
        "trial_id": spec["trial_id"],
        "attempt": spec["attempt"],
        "runner_id": runner_id,
        "env": {"ok": True, "freeze": [f"leakyfixture=={version}"], "resolution": "constrained"},
        "exit_code": 0,
        "duration_s": 60.0,
        "log_tail": f"ran {version}\n",
        "samples": series(leaks),
        "attribution": profile(spec["trace"], leaks) if spec["kind"] == "attribute" else None,
    }


def profile(tracer: str, leaks: bool) -> dict[str, Any]:
    """A tracer's profile as runners/tracehelper.py writes it: a leaking release's cache
    line grows 2 MiB a step from the third snapshot on; a clean one's holds still."""
    sizes = [i * 2 * MIB if leaks else MIB for i in range(1, 7)]
    frames = [["repro.py", 7, "<module>"], ["leakyfixture/core.py", 41, "step"]]
    times = [{"t": float(i), "step": i} for i in range(6)]
    return {
        "tracer": tracer,
        "error": None,
        "snapshots": times,
        "stacks": [{"frames": frames, "sizes": sizes}],
    }


def complete(client: TestClient, held: dict[str, Any], runner_id: str) -> Any:
    trial_id = held["trial"]["trial_id"]
    return client.post(
        f"{API}/trials/{trial_id}/complete",
        json=report(held, runner_id),
        headers=as_runner(runner_id),
    )


def heartbeat(client: TestClient, held: dict[str, Any], runner_id: str) -> Any:
    spec = held["trial"]
    return client.post(
        f"{API}/trials/{spec['trial_id']}/heartbeat",
        json={"runner_id": runner_id, "attempt": spec["attempt"], "rss": 123},
        headers=as_runner(runner_id),
    )


def drive(client: TestClient, runners: list[str]) -> list[list[str]]:
    """Runners in lockstep: each leases one trial, then each completes its own. Rounds of
    the runs (a round that only resolved the job's pins is not one)."""
    rounds = []
    while True:
        held = [(r, got) for r in runners if (got := lease(client, r)) is not None]
        if not held:
            return rounds
        runs = [got["trial"]["env"]["version"] for _, got in held if got["trial"]["kind"] == "run"]
        if runs:
            rounds.append(runs)
        for runner_id, got in held:
            response = complete(client, got, runner_id)
            assert response.status_code == 200, response.text


def reap(client: TestClient) -> list[int]:
    settings: Settings = client.app.state.settings  # type: ignore[attr-defined]
    with Session(get_engine(settings.effective_database_url)) as session:
        return tick(session, settings)


# ----------------------------------------------------------------------------- submit


def test_submit_creates_the_job_and_its_candidates(client: TestClient, fixture_index: str) -> None:
    created = submit(client, fixture_index)
    assert created["status"] == "running"
    assert created["url"] == f"http://testserver{API}/jobs/{created['id']}"
    assert created["page_url"] == f"http://testserver/jobs/{created['id']}"
    assert client.get(created["page_url"]).status_code == 200  # the page is there
    shown = job(client, created["id"])
    assert shown["job_id"] == created["id"]
    assert (shown["package"], shown["range"], shown["status"]) == (
        "leakyfixture",
        "1.0.0..1.0.9",
        "running",
    )
    rows = shown["candidates"]
    assert [c["version"] for c in rows] == [f"1.0.{i}" for i in range(10)]
    assert [c["version"] for c in rows if not c["testable"]] == ["1.0.4"]
    assert [c["version"] for c in rows if c["yanked"]] == ["1.0.3"]
    assert shown["progress"] == {
        "candidates": 10,
        "judged": 0,
        "trials_done": 0,
        "trials_running": 0,
        "trials_queued": 1,  # one slot (no runner yet): the good bound first
        "running": [],
    }
    assert shown["created_at"] and shown["finished_at"] is None


def test_bad_range_is_refused_at_submit(client: TestClient, fixture_index: str) -> None:
    response = client.post(f"{API}/jobs", json=body(fixture_index, range="1.0.0..9.9"))
    assert response.status_code == 422
    assert response.json() == {
        "detail": "range: version 9.9 of leakyfixture does not exist; nearest: 1.0.8, 1.0.9"
    }
    response = client.post(f"{API}/jobs", json=body(fixture_index, range="1.0.7..1.0.2"))
    assert response.json()["detail"] == (
        "range: range is reversed: 1.0.7 is newer than 1.0.2; write OLD..NEW"
    )
    assert client.get(f"{API}/jobs").json()["total"] == 0


@pytest.mark.parametrize(
    ("change", "detail"),
    [
        ({"script": None}, "script: field required"),
        (
            {"memory_limit": "12X"},
            "memory_limit: '12X' is not a positive size such as 4G, 512MiB, 1.5GB or a byte count",
        ),
        ({"script": "x = 1\n" * 200_000}, "script: the script is larger than 1 MiB"),
        ({"range": "1.0.0"}, "range: '1.0.0' is not a range; write GOOD..BAD, e.g. 1.0.0..1.0.9"),
        ({"repeats": 0}, "repeats: Input should be greater than or equal to 1"),
        (
            {"base_env": "leakyfixture==1.0.0\nmine @ file:///home/me/mine\n"},
            "base_env: line 2: 'mine @ file:///home/me/mine' is a direct reference (URL, VCS "
            "or local path), which is never built from a job; pin it to a version on an index",
        ),
        (
            {"base_env": "leakyfixture==1.0.0\n", "resolve_at": "latest"},
            "base_env: cannot be combined with --resolve-at: the base environment already "
            "says every other package's version; give one",
        ),
    ],
)
def test_bad_fields_are_named(
    client: TestClient, fixture_index: str, change: dict[str, Any], detail: str
) -> None:
    sent = {k: v for k, v in {**body(fixture_index), **change}.items() if v is not None}
    response = client.post(f"{API}/jobs", json=sent)
    assert response.status_code == 422
    assert response.json() == {"detail": detail}


def test_a_base_env_is_the_pins_without_a_resolve_trial(
    client: TestClient, fixture_index: str
) -> None:
    base = '[[package]]\nname = "LeakyFixture"\nversion = "1.0.9"\nsource = { registry = "x" }\n'
    base += '\n[[package]]\nname = "six"\nversion = "1.16.0"\nsource = { registry = "x" }\n'
    response = client.post(
        f"{API}/jobs", json=body(fixture_index, base_env=base, base_env_name="uv.lock")
    )
    assert response.status_code == 201, response.text
    created = response.json()
    assert job(client, created["id"])["environment"] == (
        "your base environment (1 package from uv.lock), which had leakyfixture 1.0.9; each "
        "candidate swaps in its own, with what a candidate forces noted on its row"
    )
    settings: Settings = client.app.state.settings  # type: ignore[attr-defined]
    with Session(get_engine(settings.effective_database_url)) as session:
        stored = session.get(Job, created["id"])
        assert stored is not None
        assert (stored.pin_state, stored.constraints) == (PinState.RESOLVED, ["six==1.16.0"])
        kinds = session.exec(select(Trial.kind).where(Trial.job_id == created["id"])).all()
    assert TrialKind.RESOLVE not in kinds


def test_list_filters_and_pages(client: TestClient, fixture_index: str) -> None:
    ids = [submit(client, fixture_index, reuse_verdicts=False)["id"] for _ in range(3)]
    assert client.post(f"{API}/jobs/{ids[1]}/cancel", json={}).status_code == 200

    page = client.get(f"{API}/jobs", params={"limit": 2}).json()
    assert (page["total"], page["limit"], page["offset"]) == (3, 2, 0)
    assert [j["id"] for j in page["items"]] == [ids[2], ids[1]]  # newest first
    page = client.get(f"{API}/jobs", params={"limit": 2, "offset": 2}).json()
    assert [j["id"] for j in page["items"]] == [ids[0]]
    first = page["items"][0]
    assert first["url"].endswith(f"/jobs/{ids[0]}")
    assert (first["range"], first["status"]) == ("1.0.0..1.0.9", "running")

    def listed(**params: Any) -> list[int]:
        return [j["id"] for j in client.get(f"{API}/jobs", params=params).json()["items"]]

    assert listed(status="cancelled") == [ids[1]]
    assert listed(status="running") == [ids[2], ids[0]]
    assert listed(package="LeakyFixture") == ids[::-1]  # PEP 503 names
    assert listed(package="other") == []
    response = client.get(f"{API}/jobs", params={"status": "lost"})
    assert response.status_code == 422
    assert response.json()["detail"].startswith("status: Input should be 'queued', 'running'")


def test_unknown_ids_are_404(client: TestClient) -> None:
    for path, what in [
        ("jobs/99", "job 99"),
        ("trials/7", "trial 7"),
        ("trials/7/samples", "trial 7"),
    ]:
        response = client.get(f"{API}/{path}")
        assert (response.status_code, response.json()) == (404, {"detail": f"{what} not found"})
    assert client.post(f"{API}/jobs/99/cancel", json={}).status_code == 404
    nobody = {"X-Runner-Secret": "not-a-secret"}
    response = client.post(
        f"{API}/runners/r-nobody/lease", params={"wait": 0}, json={}, headers=nobody
    )
    assert response.status_code == 404
    assert response.json()["detail"] == "runner r-nobody is not registered; register again"


# ------------------------------------------------------------------------ bisections


def test_one_runner_bisects_over_http(client: TestClient, fixture_index: str) -> None:
    runner = register(client, "solo")
    started = time.monotonic()
    assert lease(client, runner, wait=0) is None  # nothing queued yet: 204 at once
    assert time.monotonic() - started < 1.0
    created = submit(client, fixture_index)

    rounds = drive(client, [runner])
    assert [version for (version,) in rounds] == ONE_RUNNER_PATH
    shown = job(client, created["id"])
    assert shown["status"] == "found"
    assert (shown["last_good"], shown["first_bad"]) == ("1.0.5", "1.0.6")
    assert shown["skipped"] == ["1.0.4"] and shown["between"] == []
    assert shown["trials"] == 7
    assert shown["progress"] == {
        "candidates": 10,
        "judged": 5,
        "trials_done": 7,
        "trials_running": 0,
        "trials_queued": 0,
        "running": [],
    }
    assert shown["finished_at"] is not None
    verdicts = {c["version"]: c["verdict"] for c in shown["candidates"] if c["verdict"]}
    assert verdicts == {
        "1.0.0": "clean",
        "1.0.5": "clean",
        "1.0.6": "leak",
        "1.0.7": "leak",
        "1.0.9": "leak",
    }
    assert not any(c["reused"] for c in shown["candidates"])
    assert shown["dependency_diff"] == [
        {"package": "leakyfixture", "last_good": "1.0.5", "first_bad": "1.0.6"}
    ]
    assert shown["message"] == (
        "first bad is 1.0.6 and last good is 1.0.5, each confirmed by a second evaluation\n"
        "grows at leakyfixture/core.py:41 in step (+8.0 MiB, memray)"
    )
    # --attribute (on by default): memray, the cheaper tracer, ran both ends once more and
    # named the package's line, so tracemalloc did not run (engine/attribution.py rule 6).
    attributed = shown["attribution"]
    assert (attributed["last_good"], attributed["first_bad"]) == ("1.0.5", "1.0.6")
    assert list(attributed["tracers"]) == ["memray", "tracemalloc"]
    finding = attributed["tracers"]["memray"]
    assert finding["seconds"] == {"good": 60.0, "bad": 60.0}
    assert finding["stacks"] == [
        {
            "site": "leakyfixture/core.py:41 in step",
            "in_package": True,
            "growth_bytes": 8 * MIB,
            "good_growth_bytes": 0,
            "grew_in": 1.0,
            "frames": ["leakyfixture/core.py:41 in step", "repro.py:7 in <module>"],
        }
    ]
    assert (finding["note"], finding["cut_short"]) == (None, None)
    assert attributed["tracers"]["tracemalloc"]["note"] == (
        "not run: memray named the site (tracemalloc runs only when memray cannot)"
    )

    # The trial and its memory series, as a client reads them.
    evidence = shown["evidence"][1]
    assert evidence["version"] == "1.0.6"
    trial_id = evidence["runs"][0]["trial"]
    trial = client.get(f"{API}/trials/{trial_id}").json()
    assert (trial["version"], trial["status"], trial["verdict"]) == ("1.0.6", "done", "leak")
    assert (trial["runner_id"], trial["attempt"], trial["exit_code"]) == (runner, 1, 0)
    assert trial["log_tail"] == "ran 1.0.6\n"
    assert trial["analysis"]["host"]["verdict"] == "leak"
    assert trial["started_at"] and trial["finished_at"] and trial["duration_s"] == 60.0
    samples = client.get(f"{API}/trials/{trial_id}/samples").json()
    assert samples["trial_id"] == trial_id
    assert len(samples["samples"]) == 121
    assert samples["samples"][2] == {
        "t": 1.0,
        "rss": (500 + 2 + 4) * MIB,
        "anon": None,
        "shared": None,
        "gpu": None,
        "step": None,
    }


def test_two_runners_take_two_candidates_at_a_time(client: TestClient, fixture_index: str) -> None:
    runners = [register(client, "a"), register(client, "b")]
    created = submit(client, fixture_index)
    assert job(client, created["id"])["progress"]["trials_queued"] == 2  # both bounds at once

    rounds = drive(client, runners)
    # Each completion re-plans with the other runner's candidate still running, so the
    # free slot goes to the largest gap left: the bounds, then two cuts of the range,
    # then the boundary pair again.
    assert rounds == [
        ["1.0.0", "1.0.9"],
        ["1.0.5", "1.0.2"],
        ["1.0.7", "1.0.6"],
        ["1.0.5", "1.0.6"],
    ]
    shown = job(client, created["id"])
    assert shown["status"] == "found"
    assert (shown["last_good"], shown["first_bad"]) == ("1.0.5", "1.0.6")


def test_gpu_jobs_go_to_gpu_runners_only(client: TestClient, fixture_index: str) -> None:
    cpus = [register(client, "cpu-1"), register(client, "cpu-2")]
    gpu = register(client, "gpu-1", gpus=1)
    created = submit(client, fixture_index, requires_gpu=True)
    # One runner can run it, so one slot: the good bound alone.
    assert job(client, created["id"])["progress"]["trials_queued"] == 1
    assert all(lease(client, r) is None for r in cpus)
    held = lease(client, gpu)
    assert held is not None and held["trial"]["requires_gpu"] is True
    assert held["trial"]["env"]["version"] == "1.0.0"


# -------------------------------------------------------------------------- leases


def test_stale_lease_is_refused_and_the_reaper_requeues(
    make_client: Callable[..., Any], fixture_index: str
) -> None:
    with make_client(lease_s=0.3) as client:
        old, new = register(client, "old"), register(client, "new")
        created = submit(client, fixture_index)
        held = lease(client, old)
        assert held is not None and held["trial"]["attempt"] == 1
        trial_id = held["trial"]["trial_id"]
        ack = heartbeat(client, held, old)
        assert ack.status_code == 200 and ack.json()["lease_expires_at"]
        running = client.get(f"{API}/jobs/{created['id']}").json()["progress"]["running"]
        # Trial 2 of the job (the resolve trial was 1); trial_id is the id in the API's paths.
        assert [{k: r[k] for k in ("trial", "trial_id", "version", "runner", "attempt", "rss",
                                   "steps")} for r in running] == [
            {"trial": 2, "trial_id": trial_id, "version": "1.0.0", "runner": old, "attempt": 1,
             "rss": 123, "steps": None}  # a heartbeat that says only rss, as older runners send
        ]  # fmt: skip

        time.sleep(0.45)  # no heartbeat: the lease expires
        assert reap(client) == [trial_id]
        response = heartbeat(client, held, old)
        assert response.status_code == 409
        assert response.json() == {
            "detail": f"trial {trial_id} is queued, not leased to runner {old} attempt 1"
        }

        again = lease(client, new)
        assert again is not None
        assert (again["trial"]["trial_id"], again["trial"]["attempt"]) == (trial_id, 2)
        running = job(client, created["id"])["progress"]["running"]
        assert (running[0]["runner"], running[0]["rss"]) == (new, None)  # a new lease: blank
        response = heartbeat(client, held, old)
        assert response.status_code == 409
        # The holder (runner `new`, attempt 2) is never named to another runner.
        assert response.json()["detail"] == (
            f"trial {trial_id} is held by another lease, not runner {old} attempt 1"
        )
        response = complete(client, held, old)
        assert response.status_code == 409
        assert response.json()["detail"] == (
            f"trial {trial_id} is held by another lease, not runner {old} attempt 1"
        )

        assert complete(client, again, new).json() == {"verdict": "clean"}
        trial = client.get(f"{API}/trials/{trial_id}").json()
        assert (trial["status"], trial["runner_id"], trial["attempt"]) == ("done", new, 2)
        assert job(client, created["id"])["progress"]["trials_done"] == 1


def live_heartbeat(client: TestClient, held: dict[str, Any], runner_id: str, **live: Any) -> Any:
    spec = held["trial"]
    return client.post(
        f"{API}/trials/{spec['trial_id']}/heartbeat",
        json={"runner_id": runner_id, "attempt": spec["attempt"], **live},
        headers=as_runner(runner_id),
    )


def test_a_heartbeat_fills_the_running_trials_status_line(
    client: TestClient, fixture_index: str
) -> None:
    """What `submit --wait` draws for a running trial: its runner's last heartbeat (memory,
    steps, floors), the time since its lease by the server's clock, and what the early-stop
    rule can do for it, from the settings it was sent."""
    runner = register(client, "live")
    created = submit(client, fixture_index)
    t0 = time.time()
    held = lease(client, runner)
    assert held is not None and held["trial"]["env"]["version"] == "1.0.0"
    trial_id = held["trial"]["trial_id"]

    def running() -> dict[str, Any]:
        (shown,) = job(client, created["id"])["progress"]["running"]
        return shown

    before = running()  # leased, no heartbeat yet
    assert {k: before[k] for k in ("rss", "steps", "floor_first", "floor", "early_stop")} == {
        "rss": None, "steps": None, "floor_first": None, "floor": None, "early_stop": "cap only"
    }  # fmt: skip
    live = {"rss": 80 * MIB, "steps": 35, "floor_first": 10 * MIB, "floor": 47 * MIB}
    assert live_heartbeat(client, held, runner, **live).status_code == 200
    shown = running()
    elapsed, waited = shown.pop("elapsed_s"), time.time() - t0
    assert 0 <= elapsed <= waited  # by the server's clock, since the lease
    assert shown == {
        "trial": 2, "trial_id": trial_id, "version": "1.0.0", "runner": runner, "attempt": 1,
        "started_at": client.get(f"{API}/trials/{trial_id}").json()["started_at"],
        **live, "early_stop": "cap only",  # no full run yet: no horizon, only the cap rule
    }  # fmt: skip

    # The good bound runs to its end: 60 s and 120 step markers, the horizon of later trials.
    ended = report(held, runner) | {"steps": [[i * 0.5, i + 1] for i in range(120)]}
    done = client.post(f"{API}/trials/{trial_id}/complete", json=ended, headers=as_runner(runner))
    assert done.json() == {"verdict": "clean"}
    bad = lease(client, runner)
    assert bad is not None and bad["trial"]["env"]["version"] == "1.0.9"
    words = {}
    for steps in (59, 60):  # no leak look before half the horizon's 120 steps
        live_heartbeat(client, bad, runner, rss=90 * MIB, steps=steps)
        words[steps] = running()["early_stop"]
    assert words == {59: "from step 60", 60: "looking"}
    assert (running()["floor_first"], running()["floor"]) == (None, None)  # not said: none

    refused = live_heartbeat(client, bad, runner, steps=-1)
    assert (refused.status_code, refused.json()) == (
        422, {"detail": "steps: Input should be greater than or equal to 0"}
    )  # fmt: skip


def test_max_attempts_make_the_candidate_an_error(
    make_client: Callable[..., Any], fixture_index: str
) -> None:
    with make_client(lease_s=0.2, max_attempts=2) as client:
        runner = register(client, "flaky")
        created = submit(client, fixture_index)
        for attempt in (1, 2):
            held = lease(client, runner)
            assert held is not None and held["trial"]["attempt"] == attempt
            time.sleep(0.3)
            assert reap(client) == [held["trial"]["trial_id"]]
        trial = client.get(f"{API}/trials/{held['trial']['trial_id']}").json()
        assert (trial["status"], trial["verdict"]) == ("done", "error")
        assert trial["error"] == f"lease expired 2 times (last runner {runner})"
        shown = job(client, created["id"])
        assert shown["candidates"][0]["verdict"] == "error"
        assert shown["status"] == "error"
        # The message says why the bound failed, in the line its last run ended on.
        assert shown["message"] == (
            "good bound 1.0.0 cannot be tested: "
            "its evaluation failed (crash or infrastructure error)\n"
            f"good bound 1.0.0 ended: lease expired 2 times (last runner {runner})"
        )
        assert shown["candidates"][0]["error"] == f"lease expired 2 times (last runner {runner})"
        assert lease(client, runner) is None


def test_the_maintenance_thread_reaps(make_client: Callable[..., Any], fixture_index: str) -> None:
    with make_client(lease_s=0.2, reap_interval_s=0.05) as client:
        runner = register(client, "gone")
        submit(client, fixture_index)
        held = lease(client, runner)
        assert held is not None
        path = f"{API}/trials/{held['trial']['trial_id']}"
        deadline = time.monotonic() + 5
        while client.get(path).json()["status"] != "queued":
            assert time.monotonic() < deadline, "the reaper never requeued the trial"
            time.sleep(0.05)


def test_return_and_leave_requeue_without_using_an_attempt(
    client: TestClient, fixture_index: str
) -> None:
    first, second = register(client, "first"), register(client, "second")
    submit(client, fixture_index)
    held = lease(client, first)
    assert held is not None
    trial_id = held["trial"]["trial_id"]
    back = {"runner_id": first, "attempt": 1}
    response = client.post(f"{API}/trials/{trial_id}/return", json=back, headers=as_runner(first))
    assert response.json() == {"trial_id": trial_id, "status": "queued"}
    again = client.post(f"{API}/trials/{trial_id}/return", json=back, headers=as_runner(first))
    assert again.status_code == 409

    held = lease(client, second)
    assert held is not None and held["trial"]["attempt"] == 1
    assert client.delete(f"{API}/runners/{second}", headers=as_runner(second)).status_code == 204
    trial = client.get(f"{API}/trials/{trial_id}").json()
    assert (trial["status"], trial["attempt"], trial["runner_id"]) == ("queued", 0, None)
    left = client.post(
        f"{API}/runners/{second}/lease", params={"wait": 0}, json={}, headers=as_runner(second)
    )
    assert left.status_code == 404
    nobody = {"X-Runner-Secret": "not-a-secret"}
    assert client.delete(f"{API}/runners/r-nobody", headers=nobody).status_code == 404


def test_complete_must_name_its_trial(client: TestClient, fixture_index: str) -> None:
    runner = register(client, "r")
    submit(client, fixture_index)
    held = lease(client, runner)
    assert held is not None
    sent = report(held, runner) | {"trial_id": 999}
    response = client.post(
        f"{API}/trials/{held['trial']['trial_id']}/complete", json=sent, headers=as_runner(runner)
    )
    assert response.status_code == 422
    assert response.json()["detail"].startswith("trial_id: the report is for trial 999")


# --------------------------------------------------------------------------- cancel


def test_cancel(client: TestClient, fixture_index: str) -> None:
    runners = [register(client, "a"), register(client, "b")]
    created = submit(client, fixture_index)
    held = lease(client, runners[0])
    assert held is not None
    trial_id = held["trial"]["trial_id"]

    response = client.post(f"{API}/jobs/{created['id']}/cancel", json={})
    assert response.status_code == 200
    shown = response.json()
    assert shown["status"] == "cancelled" and shown["finished_at"] is not None
    assert shown["progress"]["trials_queued"] == 0 and shown["progress"]["trials_running"] == 0
    assert client.get(f"{API}/trials/{trial_id + 1}").json()["status"] == "cancelled"

    response = heartbeat(client, held, runners[0])
    assert (response.status_code, response.json()) == (
        409,
        {"detail": f"trial {trial_id} was cancelled"},
    )
    assert complete(client, held, runners[0]).status_code == 409
    assert lease(client, runners[1]) is None
    response = client.post(f"{API}/jobs/{created['id']}/cancel", json={})
    assert (response.status_code, response.json()) == (
        409,
        {"detail": f"job {created['id']} has already finished (cancelled)"},
    )


# ---------------------------------------------------------------------------- reuse


def test_verdicts_are_reused_by_a_later_identical_job(
    client: TestClient, fixture_index: str
) -> None:
    runner = register(client, "solo")
    first = submit(client, fixture_index)
    drive(client, [runner])

    second = submit(client, fixture_index)
    # Every verdict it needs is known, each reused as one evaluation: only the boundary
    # pair runs, to confirm it (service/reuse.py rule 4).
    assert second["status"] == "running"
    assert drive(client, [runner]) == [["1.0.5"], ["1.0.6"]]
    shown = job(client, second["id"])
    assert (shown["status"], shown["last_good"], shown["first_bad"]) == ("found", "1.0.5", "1.0.6")
    assert shown["progress"]["trials_done"] == 2
    reused = [c["version"] for c in shown["candidates"] if c["reused"]]
    assert reused == ["1.0.0", "1.0.5", "1.0.6", "1.0.7", "1.0.9"]
    assert shown["message"].splitlines()[-1] == (
        f"verdicts of 1.0.0, 1.0.5, 1.0.6, 1.0.7, 1.0.9 reused from job {first['id']}"
    )
    assert lease(client, runner) is None

    fresh = submit(client, fixture_index, reuse_verdicts=False)
    assert fresh["status"] == "running"
    shown = job(client, fresh["id"])
    assert shown["progress"]["trials_queued"] == 1
    assert not any(c["reused"] for c in shown["candidates"])
    assert "reused" not in (shown["message"] or "")

    # More repeats than its sources ran: they are weaker than its own (service/reuse.py rule
    # 3), nothing reused.
    other = submit(client, fixture_index, repeats=2)
    assert other["status"] == "running"
    assert not any(c["reused"] for c in job(client, other["id"])["candidates"])


def test_partial_reuse_runs_only_what_is_unknown(client: TestClient, fixture_index: str) -> None:
    runner = register(client, "solo")
    first = submit(client, fixture_index)
    for _ in range(2):  # judge both bounds, then stop
        held = lease(client, runner)
        assert held is not None
        assert complete(client, held, runner).status_code == 200
    assert client.post(f"{API}/jobs/{first['id']}/cancel", json={}).status_code == 200

    second = submit(client, fixture_index)
    shown = job(client, second["id"])
    assert shown["status"] == "running"
    assert [c["version"] for c in shown["candidates"] if c["reused"]] == ["1.0.0", "1.0.9"]
    assert shown["message"] == f"verdicts of 1.0.0, 1.0.9 reused from job {first['id']}"
    rounds = drive(client, [runner])
    assert [version for (version,) in rounds] == ONE_RUNNER_PATH[2:]
    shown = job(client, second["id"])
    assert (shown["status"], shown["last_good"], shown["first_bad"]) == ("found", "1.0.5", "1.0.6")
    assert shown["message"].splitlines()[-1] == (
        f"verdicts of 1.0.0, 1.0.9 reused from job {first['id']}"
    )


def test_more_refusals_name_their_cause(
    make_client: Callable[..., Any], fixture_index: str
) -> None:
    with make_client(public_url="https://bisect.example.com/") as client:
        response = client.post(f"{API}/jobs", json=body(fixture_index, package="nosuchpackage"))
        assert response.status_code == 422
        assert response.json()["detail"].startswith(
            "index_url: package 'nosuchpackage' not found on "
        )
        response = client.post(
            f"{API}/jobs",
            content=b"{not json",
            headers={"content-type": "application/json"},
        )
        assert response.status_code == 422
        assert response.json()["detail"].startswith("body: invalid JSON")
        response = client.post(f"{API}/jobs", json={"script": "pass"})
        assert response.json() == {
            "detail": "package: missing; name the package whose releases to bisect; "
            "range: missing; write GOOD..BAD, e.g. 1.0.0..1.0.9"
        }
        response = client.post(f"{API}/jobs", json=body(fixture_index, script="#" * (9 * MIB)))
        assert response.status_code == 413
        created = submit(client, fixture_index)
        assert created["url"] == f"https://bisect.example.com{API}/jobs/{created['id']}"
        assert created["page_url"] == f"https://bisect.example.com/jobs/{created['id']}"


# ------------------------------------------------------------------------- pins


def test_resolve_trial_over_the_protocol(client: TestClient, fixture_index: str) -> None:
    """The good bound's pins come from a runner, never from the API server."""
    runner = register(client, "resolver")
    response = client.post(f"{API}/jobs", json=body(fixture_index))
    assert response.status_code == 201, response.text
    job_id = response.json()["id"]
    held = lease(client, runner)
    assert held is not None
    spec = held["trial"]
    assert (spec["kind"], spec["env"]["version"], spec["env"]["constraints"]) == (
        "resolve",
        "1.0.0",
        [],
    )
    assert job(client, job_id)["progress"]["trials_queued"] == 0  # nothing runs before pins
    done = complete(client, held, runner)
    assert done.status_code == 200 and done.json() == {"verdict": None}
    first = lease(client, runner)
    assert first is not None
    assert (first["trial"]["kind"], first["trial"]["env"]["version"]) == ("run", "1.0.0")
    assert first["trial"]["env"]["constraints"] == ["leakyfixture==1.0.0"]

    # An identical job reuses those pins: it never needs a resolve trial.
    again = client.post(f"{API}/jobs", json=body(fixture_index)).json()
    settings: Settings = client.app.state.settings  # type: ignore[attr-defined]
    with Session(get_engine(settings.effective_database_url)) as session:
        second = session.get(Job, again["id"])
        assert second is not None
        assert (second.pin_state, second.constraints) == ("resolved", ["leakyfixture==1.0.0"])
        kinds = session.exec(select(Trial.kind).where(Trial.job_id == again["id"])).all()
        assert kinds == ["run"]


def test_pins_that_do_not_resolve_leave_candidates_free(
    client: TestClient, fixture_index: str
) -> None:
    runner = register(client, "resolver")
    created = client.post(f"{API}/jobs", json=body(fixture_index, reuse_verdicts=False)).json()
    held = lease(client, runner)
    assert held is not None and held["trial"]["kind"] == "resolve"
    failed = {
        "trial_id": held["trial"]["trial_id"],
        "attempt": held["trial"]["attempt"],
        "runner_id": runner,
        "env": {"ok": False, "error": "cannot resolve leakyfixture==1.0.0: no solution"},
    }
    response = client.post(
        f"{API}/trials/{held['trial']['trial_id']}/complete",
        json=failed,
        headers=as_runner(runner),
    )
    assert response.status_code == 200, response.text
    shown = job(client, created["id"])
    assert shown["message"] == (
        "no pins from the good bound (candidates resolve freely): "
        "cannot resolve leakyfixture==1.0.0: no solution"
    )
    run = lease(client, runner)
    assert run is not None
    assert (run["trial"]["kind"], run["trial"]["env"]["constraints"]) == ("run", [])
