"""Verdict reuse never carries a wrong verdict forward (service/reuse.py), on SQLite and
Postgres: the key holds --env and the script's name, reuse stays within an owner, weak and
disputed verdicts are never copied, a copied verdict is one evaluation, a bound failing on a
copied verdict runs first, and contradictions are marked in both jobs.

The scheduler and the API are real; the runs are not: `settle` finishes each queued run
trial as a ground truth says (no script runs here; tests/test_reuse_e2e.py runs them).
"""

import hashlib
import io
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from rich.console import Console
from sqlalchemy import text
from sqlalchemy.engine import Engine
from sqlmodel import Session, col, select

from contract import earlystop
from contract.errors import InvalidInput
from contract.wire import EarlyStop, EnvResult, TrialReport
from engine.verdicts import Verdict
from service import options, reuse, views
from service.app import create_app
from service.cli.display import render_report
from service.db import get_engine, make_engine, upgrade
from service.models import Candidate, Job, JobStatus, PinState, Trial, TrialKind, TrialStatus
from service.scheduler import advance
from service.schemas import Report, reuse_note
from service.settings import Settings, get_settings
from service.trials import record_report

VERSIONS = [f"1.0.{i}" for i in range(10)]
# One slot: both bounds, binary search stepping over the untestable 1.0.4, confirmation.
PATH = ["1.0.0", "1.0.9", "1.0.5", "1.0.7", "1.0.6", "1.0.5", "1.0.6"]
# What contract/earlystop.py's leak rule said when it called an import ramp a leak.
RAMP_STOP = "floor grew at least 20 MiB over 2 s at 99.55% confidence (threshold 8 MiB)"
TABLES = "memory_sample, trial, candidate, job, runner"


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def engine(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Engine]:
    """One migrated database per kind for the module; `session` empties it for each test."""
    url = f"sqlite:///{tmp_path_factory.mktemp('reuse') / 'reuse.db'}"
    if request.param == "postgres":
        url = request.getfixturevalue("pg_url")
    upgrade(url)
    engine = make_engine(url)
    yield engine
    engine.dispose()


@pytest.fixture
def session(engine: Engine) -> Iterator[Session]:
    with engine.begin() as conn:
        if engine.dialect.name == "postgresql":
            conn.execute(text(f"TRUNCATE {TABLES} RESTART IDENTITY CASCADE"))
        else:  # ids restart too: SQLite reuses rowids above the highest left
            for table in TABLES.split(", "):
                conn.execute(text(f"DELETE FROM {table}"))
    with Session(engine) as session:
        yield session


def seed(session: Session, **fields: Any) -> Job:
    values: dict[str, Any] = {
        "package": "leakyfixture",
        "good": VERSIONS[0],
        "bad": VERSIONS[-1],
        "script": "pass",
        "script_sha256": "abc",
        "constraints": ["leakyfixture==1.0.0"],
        "attribute": False,
        **fields,
    }
    job = Job(**values)
    session.add(job)
    session.flush()
    for position, version in enumerate(VERSIONS):
        testable = version != "1.0.4"
        session.add(Candidate(job_id=job.id, position=position, version=version, testable=testable))
    session.commit()
    session.refresh(job)
    return job


def rows(session: Session, job: Job) -> dict[str, Candidate]:
    query = select(Candidate).where(Candidate.job_id == job.id).order_by(col(Candidate.position))
    return {c.version: c for c in session.exec(query.execution_options(populate_existing=True))}


def ran(session: Session, job: Job) -> list[str]:
    """The versions of the job's run trials, in the order they were queued."""
    query = (
        select(Candidate.version)
        .join(Trial, col(Trial.candidate_id) == Candidate.id)
        .where(Trial.job_id == job.id, Trial.kind == TrialKind.RUN)
        .order_by(col(Trial.id))
    )
    return list(session.exec(query))


def reused(session: Session, job: Job) -> list[str]:
    return [v for v, c in rows(session, job).items() if c.reused_from is not None]


def leaks(version: str, first_leak: str) -> bool:
    return tuple(map(int, version.split("."))) >= tuple(map(int, first_leak.split(".")))


Analysis = Callable[[bool], dict[str, Any]]


def full_run(leaking: bool) -> dict[str, Any]:
    """A run that went to its end."""
    return {"growth_mib": 40.0 if leaking else 0.5, "stopped_early": None}


def settle(
    session: Session, job: Job, first_leak: str = "1.0.6", analysis: Analysis = full_run
) -> None:
    """Advance `job`, finishing every queued run trial as the ground truth says, until
    nothing is queued."""
    advance(session, job, 1)
    while True:
        query = select(Trial).where(Trial.job_id == job.id, Trial.status == TrialStatus.QUEUED)
        queued = list(session.exec(query))
        if not queued:
            return
        for trial in queued:
            candidate = session.get(Candidate, trial.candidate_id)
            assert candidate is not None and trial.kind == TrialKind.RUN
            leaking = leaks(candidate.version, first_leak)
            trial.status = TrialStatus.DONE
            trial.verdict = Verdict.LEAK if leaking else Verdict.CLEAN
            trial.analysis = analysis(leaking) if leaking else full_run(False)
            session.add(trial)
        session.commit()
        advance(session, job, 1)


# ----------------------------------------------------------------------------- 1. key


def old_key(job: Job, candidate: Candidate) -> str:
    """The key KEY_VERSION 1 wrote: no --env variables, no script name, repeats in it."""
    material = reuse.key_material(job, candidate)
    del material["options"]["variables"], material["options"]["script_name"]
    material["v"] = 1
    material["options"]["repeats"] = job.repeats
    blob = json.dumps(material, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()


def test_the_key_holds_env_variables_and_old_keys_never_match(session: Session) -> None:
    plain = seed(session)
    candidate = rows(session, plain)["1.0.5"]
    base = reuse.reuse_key(plain, candidate)
    assert reuse.key_material(plain, candidate)["v"] == reuse.KEY_VERSION == 3
    for fields in [{"variables": {"LEAK": "1"}}, {"variables": {"PYTHONPATH": "/tmp/fake"}}]:
        assert reuse.reuse_key(seed(session, **fields), candidate) != base, fields
    ab = seed(session, variables={"A": "1", "B": "2"})
    ba = seed(session, variables={"B": "2", "A": "1"})
    assert reuse.reuse_key(ab, candidate) == reuse.reuse_key(ba, candidate)

    # A job of the old code, its keys as that code wrote them (it held "1.0.0: leak"
    # from a run with LEAK=1, say): a job of the new code never matches them.
    old = seed(session, variables={"LEAK": "1"})
    for row in rows(session, old).values():
        row.reuse_key = old_key(plain, row)
        session.add(row)
    session.commit()
    settle(session, old, first_leak="1.0.0")
    assert old.status == JobStatus.BOUNDS_FAILED
    new = seed(session)
    advance(session, new, 1)
    assert (reused(session, new), ran(session, new)) == ([], ["1.0.0"])


# --------------------------------------------------------------------------- 3. source


def test_reuse_stays_within_an_owner(session: Session) -> None:
    alice = seed(session, owner="alice")
    settle(session, alice)
    assert alice.status == JobStatus.FOUND
    # Bob's job of the same key, and one with no owner (the open service): nothing of
    # alice's reaches them; they run their bounds themselves.
    for owner in ("bob", None):
        other = seed(session, owner=owner)
        advance(session, other, 1)
        assert (reused(session, other), ran(session, other)) == ([], ["1.0.0"]), owner
        assert other.message is None
    # Bob's runs disagree with alice's (his runner says nothing leaks): hers stay unmarked.
    bob = seed(session, owner="bob")
    settle(session, bob, first_leak="9.9.9")
    assert bob.message == (
        "bad bound 1.0.9 does not leak (clean): nothing to bisect; "
        "to map a range whose bounds agree, use --all-transitions"
    )
    assert all(c.contradicted_by_job is None for c in rows(session, alice).values())
    # Alice's next job reuses hers and names only her job.
    again = seed(session, owner="alice")
    advance(session, again, 1)
    assert reused(session, again) == ["1.0.0", "1.0.5", "1.0.6", "1.0.7", "1.0.9"]
    ids = [c.reused_from for c in rows(session, again).values() if c.reused_from]
    query = select(Candidate.job_id).where(col(Candidate.id).in_(ids))
    assert set(session.exec(query)) == {alice.id}
    assert again.message == (
        f"verdicts of 1.0.0, 1.0.5, 1.0.6, 1.0.7, 1.0.9 reused from job {alice.id}"
    )
    # An attribution is lent within the owner only.
    alice.attribution = {"last_good": "1.0.5", "first_bad": "1.0.6", "message": "grows at x"}
    session.add(alice)
    session.commit()
    for job, lender in ((again, alice.id), (bob, None)):
        good, bad = rows(session, job)["1.0.5"], rows(session, job)["1.0.6"]
        found = reuse.find_attribution(session, job, good, bad)
        assert (found.id if found else None) == lender


def stopped(horizon_s: float | None, reason: str = RAMP_STOP) -> Analysis:
    """A leak the early-stop rule called, with the horizon its record gave (None: no
    record, as every run of the code before it)."""

    def analysis(leaking: bool) -> dict[str, Any]:
        record = None if horizon_s is None else {"horizon_s": horizon_s, "looks": 1}
        return {"growth_mib": 20.0, "stopped_early": reason, "early_stop": record}

    return analysis


CAP_STOP = f"{reuse.CAP_NEAR}: memory at 470 MiB, 92% of the 512 MiB cap, after the floor rose"


@pytest.mark.parametrize(
    ("analysis", "strong"),
    [
        (full_run, True),
        (stopped(None), False),  # rows of the code before the record
        (stopped(4.5), False),  # the import-ramp case: half of a 4.5 s horizon
        (stopped(earlystop.MIN_HORIZON_S - 0.1), False),
        (stopped(earlystop.MIN_HORIZON_S), True),
        (stopped(None, CAP_STOP), True),  # the cap would have killed it: an OOM leak
    ],
    ids=["ran-to-end", "no-record", "horizon-4.5s", "just-short", "long-horizon", "cap-near"],
)
def test_a_leak_stopped_early_on_a_short_horizon_is_not_reused(
    session: Session, analysis: Analysis, strong: bool
) -> None:
    first = seed(session)
    settle(session, first, analysis=analysis)
    assert first.status == JobStatus.FOUND
    second = seed(session)
    advance(session, second, 1)
    if strong:
        assert reused(session, second) == ["1.0.0", "1.0.5", "1.0.6", "1.0.7", "1.0.9"]
        assert ran(session, second) == ["1.0.5"]  # the boundary pair's confirmation
    else:
        # The clean verdicts ran to their end and are copied; every leak runs again.
        assert reused(session, second) == ["1.0.0"]
        assert ran(session, second) == ["1.0.9"]
    settle(session, second)
    assert second.status == JobStatus.FOUND
    if not strong:
        assert ran(session, second) == ["1.0.9", "1.0.7", "1.0.6", "1.0.5", "1.0.6"]
        assert reused(session, second) == ["1.0.0", "1.0.5"]


def test_the_cap_rule_words_its_stop_as_reuse_reads_it() -> None:
    """contract/earlystop.py's cap rule, on a trace that climbs to its cap."""
    t = [i * 0.1 for i in range(200)]
    rss = [(100 + 2 * i) * 1024 * 1024 for i in range(200)]
    es = EarlyStop(horizon_s=None)
    stop = earlystop.first_stop(t, rss, [], 320 * 1024 * 1024, es)
    assert stop is not None and stop[1].startswith(reuse.CAP_NEAR), stop


def test_flaky_contradicted_reused_and_fewer_repeat_sources_are_not_reused(
    session: Session,
) -> None:
    first = seed(session)
    settle(session, first)
    source = rows(session, first)
    flaky, contradicted = source["1.0.0"], source["1.0.9"]
    flaky.evaluations = ["clean", "leak"]
    contradicted.contradicted_by_job = 99
    session.add_all([flaky, contradicted])
    session.commit()
    second = seed(session)
    advance(session, second, 1)
    assert (reused(session, second), ran(session, second)) == ([], ["1.0.0"])
    # A candidate that is itself a copy is no source: copy the first job's 1.0.5 into
    # the second, then dispute the original; a third job finds nothing to copy.
    copy = rows(session, second)["1.0.5"]
    assert reuse.try_reuse(session, second, copy) and copy.evaluations == ["clean"]
    assert copy.reused_from == source["1.0.5"].id
    third = seed(session)
    reuse.ensure_keys(session, third, list(rows(session, third).values()))
    assert reuse.find_source(session, third, rows(session, third)["1.0.5"]) == source["1.0.5"]
    source["1.0.5"].contradicted_by_job = 99
    session.add(source["1.0.5"])
    session.commit()
    assert reuse.find_source(session, third, rows(session, third)["1.0.5"]) is None
    # Two runs per evaluation asked: one-run verdicts are weaker, none is copied.
    more = seed(session, repeats=2)
    advance(session, more, 1)
    assert (reused(session, more), ran(session, more)) == ([], ["1.0.0", "1.0.0"])


# ---------------------------------------------------------------------- 4, 5, 6. copy


def test_a_copied_verdict_counts_once_so_the_pair_runs_again(session: Session) -> None:
    first = seed(session)
    settle(session, first)
    second = seed(session)
    settle(session, second)
    assert (second.status, ran(session, second)) == (JobStatus.FOUND, ["1.0.5", "1.0.6"])
    copied = rows(session, second)
    assert [copied[v].evaluations for v in ("1.0.0", "1.0.5", "1.0.6")] == [
        ["clean"],
        ["clean", "clean"],
        ["leak", "leak"],
    ]


def test_a_bound_failing_on_a_copied_verdict_runs_and_both_jobs_say_flaky(
    session: Session,
) -> None:
    # The poisoned earlier job: its machine made 1.0.0 leak, a full run, strong as any.
    loaded = seed(session)
    settle(session, loaded, first_leak="1.0.0")
    assert (loaded.status, ran(session, loaded)) == (JobStatus.BOUNDS_FAILED, ["1.0.0"])
    # The next job copies "1.0.0: leak", then runs 1.0.0 itself before failing on it.
    idle = seed(session)
    advance(session, idle, 1)
    assert idle.status == JobStatus.RUNNING
    assert (reused(session, idle), ran(session, idle)) == (["1.0.0"], ["1.0.0"])
    settle(session, idle)
    assert (idle.status, ran(session, idle)) == (JobStatus.INCONCLUSIVE, ["1.0.0"])
    assert idle.message is not None and idle.message.splitlines() == [
        "good bound 1.0.0 is flaky: its evaluations disagree (leak, clean)",
        f"verdict of 1.0.0 reused from job {loaded.id}",
    ]
    assert rows(session, idle)["1.0.0"].contradicted_by_job == loaded.id
    assert rows(session, loaded)["1.0.0"].contradicted_by_job == idle.id
    assert [v for v, c in rows(session, loaded).items() if c.contradicted_by_job] == ["1.0.0"]
    # Never a source again: the next job runs its whole search itself.
    later = seed(session)
    settle(session, later)
    assert (later.status, reused(session, later), ran(session, later)) == (
        JobStatus.FOUND, [], PATH
    )  # fmt: skip


def test_a_bound_failing_on_a_copied_verdict_that_holds_fails_after_one_run(
    session: Session,
) -> None:
    first = seed(session)
    settle(session, first, first_leak="1.0.0")
    second = seed(session)
    settle(session, second, first_leak="1.0.0")
    assert (second.status, ran(session, second)) == (JobStatus.BOUNDS_FAILED, ["1.0.0"])
    assert second.message == (
        "good bound 1.0.0 leaks: it must not; to map a range whose bounds agree, use "
        f"--all-transitions\nverdict of 1.0.0 reused from job {first.id}"
    )
    assert rows(session, second)["1.0.0"].evaluations == ["leak", "leak"]
    assert rows(session, first)["1.0.0"].contradicted_by_job is None


def test_a_bound_failing_on_a_copied_verdict_whose_own_runs_decide_nothing_runs_again(
    session: Session,
) -> None:
    # Rule 5 with issue #35's rule: an inconclusive run of its own contradicts nothing and
    # confirms nothing, so the copied leak is still alone: 1.0.0 runs again, up to the
    # planner's three evaluations, and the job ends unconfirmed, never failing on the copy.
    first = seed(session)
    settle(session, first, first_leak="1.0.0")
    second = seed(session, max_runs=1)
    advance(session, second, 1)
    for _ in range(3):
        query = select(Trial).where(Trial.job_id == second.id, Trial.status == TrialStatus.QUEUED)
        for trial in session.exec(query):
            trial.status, trial.verdict = TrialStatus.DONE, Verdict.INCONCLUSIVE
            trial.analysis = full_run(False)
            session.add(trial)
        session.commit()
        advance(session, second, 1)
    assert (second.status, ran(session, second)) == (JobStatus.INCONCLUSIVE, ["1.0.0"] * 2)
    assert rows(session, second)["1.0.0"].evaluations == ["leak", "inconclusive", "inconclusive"]
    assert second.message is not None and second.message.splitlines() == [
        "good bound 1.0.0 is unconfirmed: its evaluations were leak, inconclusive, "
        "inconclusive; its re-runs decided nothing, pooled or alone",
        f"verdict of 1.0.0 reused from job {first.id}",
    ]
    # Undecided runs contradict nothing: the earlier job's verdict stands.
    assert rows(session, first)["1.0.0"].contradicted_by_job is None
    assert rows(session, second)["1.0.0"].contradicted_by_job is None


def test_a_fresh_job_marks_the_earlier_verdicts_it_contradicts(session: Session) -> None:
    # Alice's first job called 1.0.3 and 1.0.5 leaks (a loaded machine); bob's agrees.
    loaded = seed(session, owner="alice")
    settle(session, loaded, first_leak="1.0.3")
    bob = seed(session, owner="bob")
    settle(session, bob, first_leak="1.0.3")
    assert (loaded.status, (loaded.result or {}).get("first_new")) == (JobStatus.FOUND, "1.0.3")
    # Her --no-reuse job (or "Bisect again") runs everything and finds 1.0.5 clean.
    fresh = seed(session, owner="alice", reuse_verdicts=False, repeats=2)
    settle(session, fresh)
    assert (fresh.status, reused(session, fresh)) == (JobStatus.FOUND, [])
    marked = {v: c.contradicted_by_job for v, c in rows(session, loaded).items()}
    assert {v: j for v, j in marked.items() if j} == {"1.0.5": fresh.id}
    assert all(c.contradicted_by_job is None for c in rows(session, bob).values())
    assert all(c.contradicted_by_job is None for c in rows(session, fresh).values())


# ------------------------------------------------------------------ the service path

ALICE, BOB, RUNNER = "alice-tok", "bob-tok", "run-tok"
SCRIPT = "import leakyfixture\nfor _ in range(40):\n    leakyfixture.step()\n"


@pytest.fixture
def service(
    tmp_path: Path, uv_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[TestClient]:
    monkeypatch.setenv("UV_CACHE_DIR", str(uv_cache))
    settings = Settings(
        database_url=f"sqlite:///{tmp_path / 'service.db'}",
        data_dir=tmp_path / "data",
        cache_dir=tmp_path / "cache",
        reap_interval_s=0,
        trusted_hosts=["testserver"],
        allowed_indexes=["127.0.0.1"],
        api_tokens=f"alice:{ALICE},bob:{BOB}",
        runner_tokens=RUNNER,
    )
    with TestClient(create_app(settings)) as client:
        yield client


def submit(client: TestClient, token: str, index: str, **fields: Any) -> int:
    body = {"package": "leakyfixture", "range": "1.0.5..1.0.9", "script": SCRIPT,
            "index_url": index, "attribute": False, **fields}  # fmt: skip
    response = client.post("/api/v1/jobs", json=body, headers={"Authorization": f"Bearer {token}"})
    assert response.status_code == 201, response.text
    return response.json()["id"]


def settle_service(client: TestClient, job_id: int, first_leak: str) -> None:
    """Pins as a runner's resolve trial gives them, then every run as the truth says."""
    url = client.app.state.settings.effective_database_url  # type: ignore[attr-defined]
    with Session(get_engine(url)) as session:
        job = session.get(Job, job_id)
        assert job is not None
        if job.pin_state == PinState.PENDING:
            query = select(Trial).where(Trial.job_id == job_id, Trial.kind == TrialKind.RESOLVE)
            trial = session.exec(query).one()
            good = session.get(Candidate, trial.candidate_id)
            assert good is not None
            pins = TrialReport(trial_id=trial.id, env=EnvResult(ok=True), pins=[
                f"leakyfixture=={good.version}"
            ])  # fmt: skip
            record_report(session, job, good, trial, pins)
        settle(session, job, first_leak)


def shown(client: TestClient, token: str, job_id: int) -> dict[str, Any]:
    response = client.get(f"/api/v1/jobs/{job_id}", headers={"Authorization": f"Bearer {token}"})
    assert response.status_code == 200, response.text
    return response.json()


def test_bobs_jobs_never_answer_alices_and_again_marks_what_it_contradicts(
    service: TestClient, fixture_index: str
) -> None:
    # Bob's job with PYTHONPATH at a fake module, and a plain one: his runs say nothing
    # leaks, the bad bound included.
    fake = submit(service, BOB, fixture_index, variables={"PYTHONPATH": "/tmp/fake"})
    plain = submit(service, BOB, fixture_index)
    for job_id in (fake, plain):
        settle_service(service, job_id, first_leak="9.9.9")
        assert shown(service, BOB, job_id)["status"] == "bounds_failed"
    # Alice's job of the same script runs its own search: nothing of bob's is copied or named.
    mine = submit(service, ALICE, fixture_index)
    answer = shown(service, ALICE, mine)
    assert answer["status"] == "running"
    # Her machine was loaded that day: her good bound "leaked". Bob's said clean, and his
    # 1.0.5 was not copied: she ran it herself.
    settle_service(service, mine, first_leak="1.0.5")
    answer = shown(service, ALICE, mine)
    assert (answer["status"], answer["trials"]) == ("bounds_failed", 1)
    assert answer["message"] == (
        "good bound 1.0.5 leaks: it must not; to map a range whose bounds agree, use "
        "--all-transitions"
    )
    assert not any(c["reused"] for c in answer["candidates"])
    assert f"job {fake}" not in answer["message"] and f"job {plain}" not in answer["message"]
    # "Bisect again" runs every release afresh; where its runs disagree, her first job
    # says so: 1.0.5 is flaky, contradicted by the new job.
    response = service.post(
        f"/api/v1/jobs/{mine}/again", json={}, headers={"Authorization": f"Bearer {ALICE}"}
    )
    assert response.status_code == 201, response.text
    again = response.json()["id"]
    settle_service(service, again, first_leak="1.0.6")
    redo = shown(service, ALICE, again)
    assert (redo["status"], redo["first_bad"], redo["trials"]) == ("found", "1.0.6", 12)
    assert not any(c["reused"] for c in redo["candidates"])
    first = shown(service, ALICE, mine)["candidates"]
    assert {c["version"]: again for c in first if c["contradicted_by_job"]} == {"1.0.5": again}
    assert [c["contradicted_by_job"] for c in first if c["version"] == "1.0.5"] == [again]
    for job_id in (fake, plain):
        assert not any(c["contradicted_by_job"] for c in shown(service, BOB, job_id)["candidates"])


# ------------------------------------------- 1, 3, 8. every option keyed; trust groups

# The options declared unable to change a verdict (`option(verdict=False)`): a new one
# joins this list only after a look at why (service/options.py says it beside each).
NOT_KEYED = {"skip_yanked", "find_fix", "all_transitions", "repeats", "max_runs",
             "reuse_verdicts", "early_stop", "attribute", "commits", "repo",
             "webhook_url"}  # fmt: skip
# A different, meaningful value for an option whose default says nothing to change.
OTHER = {"resolve_at": "2024-01-01", "package": "otherpkg", "script": "import os\n",
         "python": "3.12", "index_url": "http://127.0.0.1:1/simple", "min_growth_mib": 16.0,
         "min_growth_fraction": 0.5, "memory_limit": 1 << 30}  # fmt: skip


# --from/--to come as a pair (the job's policy reads both): each is changed within one.
PAIR = {"from_env": "a==1.0\n", "to_env": "a==2.0\n"}


def other_value(name: str, value: Any) -> Any:
    """A value of the option's type unlike `value` (the Job row is not validated)."""
    if name in OTHER:
        return OTHER[name]
    if isinstance(value, bool):
        return not value
    if isinstance(value, int | float):
        return value * 2
    if isinstance(value, list):
        return [*value, "otherdep==1.0"]
    if isinstance(value, dict):
        return {**value, "PYTHONPATH": "/tmp/fake"}
    if name.endswith("env"):
        return f"{value or ''}other==1.0\n"
    return f"{value}-other" if value else f"{name}-other"


@pytest.mark.parametrize("name", list(options.JobOptions.model_fields))
def test_every_option_that_can_change_a_verdict_changes_the_key(
    session: Session, name: str
) -> None:
    """Iterates the definitions, so a new option is covered without a new test."""
    pair = PAIR if name in PAIR else {}
    plain = seed(session, **pair)
    candidate = rows(session, plain)["1.0.5"]
    changed = seed(session, **{**pair, name: other_value(name, getattr(plain, name))})
    keyed = options.changes_verdict(options.JobOptions.model_fields[name])
    assert keyed == (name not in NOT_KEYED) == (name in reuse.VERDICT_OPTIONS)
    differs = reuse.reuse_key(changed, candidate) != reuse.reuse_key(plain, candidate)
    assert differs == keyed, (name, getattr(changed, name))


@pytest.fixture
def groups(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[str], None]]:
    """Sets BISECT_REUSE_GROUPS as an operator would (the settings are read again)."""

    def configure(text: str) -> None:
        monkeypatch.setenv("BISECT_REUSE_GROUPS", text)
        get_settings.cache_clear()

    yield configure
    get_settings.cache_clear()


def test_a_trust_group_shares_verdicts_and_names_only_the_owners_own_jobs(
    session: Session, groups: Callable[[str], None]
) -> None:
    groups("alice,bob;carol,dave")
    assert reuse.owners("alice") == {"alice", "bob"} and reuse.owners("erin") == {"erin"}
    bob = seed(session, owner="bob")
    settle(session, bob)
    assert bob.status == JobStatus.FOUND
    # Carol is in another group: she runs her bounds herself.
    carol = seed(session, owner="carol")
    advance(session, carol, 1)
    assert (reused(session, carol), ran(session, carol)) == ([], ["1.0.0"])
    # Alice's job copies bob's verdicts; its message does not name his job.
    alice = seed(session, owner="alice")
    settle(session, alice)
    assert (alice.status, ran(session, alice)) == (JobStatus.FOUND, ["1.0.5", "1.0.6"])
    assert alice.message is not None and alice.message.splitlines()[-1] == (
        "verdicts of 1.0.0, 1.0.5, 1.0.6, 1.0.7, 1.0.9 reused from an earlier job of this "
        "trust group"
    )
    assert f"job {bob.id}" not in alice.message
    # Bob's own next job names his own job.
    bob_again = seed(session, owner="bob")
    advance(session, bob_again, 1)
    assert bob_again.message is not None and f"from job {bob.id}" in bob_again.message
    # Verdicts from her own job and from bob's in one note: hers named, his not.
    own = seed(session, owner="alice", reuse_verdicts=False)
    settle(session, own)
    mixed = rows(session, seed(session, owner="alice"))
    mixed["1.0.0"].reused_from = rows(session, own)["1.0.0"].id
    mixed["1.0.7"].reused_from = rows(session, bob)["1.0.7"].id
    assert reuse.note(session, list(mixed.values())) == (
        f"verdict of 1.0.0 reused from job {own.id}; "
        "verdict of 1.0.7 reused from an earlier job of this trust group"
    )


def test_other_variables_never_cross_even_inside_a_trust_group(
    session: Session, groups: Callable[[str], None]
) -> None:
    groups("alice,bob")
    # Bob's PYTHONPATH job: a fake module that never leaks, the bad bound included.
    fake = seed(session, owner="bob", variables={"PYTHONPATH": "/tmp/fake"})
    settle(session, fake, first_leak="9.9.9")
    assert fake.status == JobStatus.BOUNDS_FAILED
    alice = seed(session, owner="alice")
    settle(session, alice)
    assert (alice.status, reused(session, alice), ran(session, alice)) == (
        JobStatus.FOUND, [], PATH
    )  # fmt: skip
    assert alice.message is not None and "reused" not in alice.message
    # Bob's own job with the same variables does reuse his.
    again = seed(session, owner="bob", variables={"PYTHONPATH": "/tmp/fake"})
    advance(session, again, 1)
    assert reused(session, again) == ["1.0.0", "1.0.9"]
    assert again.message == f"verdicts of 1.0.0, 1.0.9 reused from job {fake.id}"


def test_a_contradiction_inside_a_trust_group_stops_the_verdict_for_all(
    session: Session, groups: Callable[[str], None]
) -> None:
    groups("alice,bob")
    loaded = seed(session, owner="alice")
    settle(session, loaded, first_leak="1.0.3")  # her loaded machine: 1.0.5 "leaks"
    fresh = seed(session, owner="bob", reuse_verdicts=False, repeats=2)
    settle(session, fresh)
    marked = {v: c.contradicted_by_job for v, c in rows(session, loaded).items()}
    assert {v: j for v, j in marked.items() if j} == {"1.0.5": fresh.id}
    # Neither owner copies her disputed 1.0.5 again: the group's source is bob's clean one.
    for owner in ("alice", "bob"):
        later = seed(session, owner=owner)
        reuse.ensure_keys(session, later, list(rows(session, later).values()))
        source = reuse.find_source(session, later, rows(session, later)["1.0.5"])
        assert source is not None and (source.job_id, source.verdict) == (fresh.id, "clean")


@pytest.mark.parametrize(
    ("text", "line"),
    [
        ("alice,bob;bob,carol", "bob is in two groups; an owner belongs to one at most"),
        ("alice,bob;carol", "the group 'carol' has one owner; a group needs two or more"),
        ("alice,b ob", "'b ob' is not an owner name (letters, digits, _ . - : / @; at most 128)"),
    ],
)
def test_a_bad_trust_group_setting_is_one_line_at_startup(
    groups: Callable[[str], None], text: str, line: str
) -> None:
    groups(text)
    with pytest.raises(InvalidInput) as raised:
        get_settings()
    assert str(raised.value) == f"BISECT_REUSE_GROUPS: {line}"


def test_a_trust_group_takes_ci_identity_owners(groups: Callable[[str], None]) -> None:
    """An owner a CI identity token maps to (service/oidc.py) may be in a group too."""
    groups("alice,github:myorg/app; gitlab:group/sub/project,ci@host")
    assert get_settings().reuse_groups == [
        frozenset({"alice", "github:myorg/app"}),
        frozenset({"gitlab:group/sub/project", "ci@host"}),
    ]


def test_through_the_api_a_trust_group_reuses_and_names_no_other_owners_job(
    service: TestClient, fixture_index: str, groups: Callable[[str], None]
) -> None:
    groups("alice,bob")
    bobs = submit(service, BOB, fixture_index)
    settle_service(service, bobs, first_leak="1.0.7")
    assert shown(service, BOB, bobs)["first_bad"] == "1.0.7"
    mine = submit(service, ALICE, fixture_index)
    settle_service(service, mine, first_leak="1.0.7")
    answer = shown(service, ALICE, mine)
    assert (answer["status"], answer["first_bad"]) == ("found", "1.0.7")
    assert [c["version"] for c in answer["candidates"] if c["reused"]] == [
        "1.0.5", "1.0.6", "1.0.7", "1.0.8", "1.0.9"
    ]  # fmt: skip
    assert answer["message"].splitlines()[-1] == (
        "verdicts of 1.0.5, 1.0.6, 1.0.7, 1.0.8, 1.0.9 reused from an earlier job of this "
        "trust group"
    )
    assert f"job {bobs}" not in answer["message"]


# ------------------------------------ 5. the views name no other owner's job (issue 26)

GROUP_NOTE = "flaky: contradicted by a job of this trust group"


def cli_text(report: Report) -> str:
    out = io.StringIO()
    render_report(Console(file=out, width=400, no_color=True), report, {})
    return out.getvalue()


def test_the_views_name_a_contradicting_or_source_job_only_when_it_is_the_owners(
    session: Session, groups: Callable[[str], None]
) -> None:
    groups("alice,bob")
    loaded = seed(session, owner="alice")
    settle(session, loaded, first_leak="1.0.3")  # her loaded machine: 1.0.5 "leaks"
    bobs = seed(session, owner="bob", reuse_verdicts=False, repeats=2)
    settle(session, bobs)  # bob's 1.0.5 is clean: his job contradicts hers
    own = seed(session, owner="alice", reuse_verdicts=False)
    settle(session, own)
    marked = rows(session, loaded)
    assert marked["1.0.5"].contradicted_by_job == bobs.id
    marked["1.0.0"].contradicted_by_job = own.id  # one of her own jobs disputes 1.0.0
    session.add(marked["1.0.0"])
    session.commit()
    report = views.job_report(session, loaded)
    shown_rows = {r.version: r for r in report.candidates}
    assert (shown_rows["1.0.5"].contradicted, shown_rows["1.0.5"].contradicted_by_job) == (
        True, None
    )  # fmt: skip
    assert (shown_rows["1.0.0"].contradicted, shown_rows["1.0.0"].contradicted_by_job) == (
        True, own.id
    )  # fmt: skip
    wire = json.loads(report.model_dump_json())
    assert [c["contradicted_by_job"] for c in wire["candidates"] if c["contradicted"]] == [
        own.id, None
    ]  # fmt: skip
    for text_ in (views.job_markdown(session, loaded), cli_text(report)):
        assert GROUP_NOTE in text_
        assert f"flaky: contradicted by job {own.id}" in text_
        assert f"contradicted by job {bobs.id}" not in text_
    # A job of hers copying from her own job and from bob's: only hers is named.
    later = seed(session, owner="alice")
    copied = rows(session, later)
    copied["1.0.0"].reused_from = rows(session, own)["1.0.0"].id
    copied["1.0.7"].reused_from = rows(session, bobs)["1.0.7"].id
    session.add_all([copied["1.0.0"], copied["1.0.7"]])
    session.commit()
    again = {r.version: r for r in views.job_report(session, later).candidates}
    assert (again["1.0.0"].reused_from_job, again["1.0.7"].reused_from_job) == (own.id, None)
    assert reuse_note(again["1.0.0"]) == f"verdicts reused from job {own.id}"
    assert reuse_note(again["1.0.7"]) == "verdicts reused from an earlier job of this trust group"
    # Bob's view of his own job names nothing of hers either (nothing of his was disputed).
    assert not any(r.contradicted for r in views.job_report(session, bobs).candidates)


def login(client: TestClient, token: str) -> None:
    client.get("/login")
    response = client.post("/login", data={"csrf": client.cookies["lb_csrf"], "token": token})
    assert response.status_code in (200, 303), response.text


def test_the_api_markdown_and_page_never_show_a_group_mates_job_id(
    service: TestClient, fixture_index: str, groups: Callable[[str], None]
) -> None:
    groups("alice,bob")
    hers = submit(service, ALICE, fixture_index)
    settle_service(service, hers, first_leak="1.0.7")
    copy = submit(service, BOB, fixture_index)  # copies her verdicts
    settle_service(service, copy, first_leak="1.0.7")
    # Bob's fresh job finds 1.0.6 leaking: it contradicts her 1.0.6.
    bobs = submit(service, BOB, fixture_index, reuse_verdicts=False)
    settle_service(service, bobs, first_leak="1.0.6")
    # Her fresh job finds 1.0.7 clean: it contradicts her own 1.0.7 and bob's.
    mine = submit(service, ALICE, fixture_index, reuse_verdicts=False)
    settle_service(service, mine, first_leak="1.0.8")
    answer = {c["version"]: c for c in shown(service, ALICE, hers)["candidates"]}
    assert (answer["1.0.6"]["contradicted"], answer["1.0.6"]["contradicted_by_job"]) == (
        True, None
    )  # fmt: skip
    assert (answer["1.0.7"]["contradicted"], answer["1.0.7"]["contradicted_by_job"]) == (
        True, mine
    )  # fmt: skip
    auth = {"Authorization": f"Bearer {ALICE}"}
    markdown = service.get(f"/api/v1/jobs/{hers}/report.md", headers=auth).text
    assert GROUP_NOTE in markdown and f"flaky: contradicted by job {mine}" in markdown
    assert f"job {bobs}" not in markdown
    # Bob sees his fresh job's 1.0.7 disputed by her job, unnamed; his copy's source unnamed.
    his = {c["version"]: c for c in shown(service, BOB, bobs)["candidates"]}
    assert (his["1.0.7"]["contradicted"], his["1.0.7"]["contradicted_by_job"]) == (True, None)
    copied = shown(service, BOB, copy)["candidates"]
    assert [c["reused_from_job"] for c in copied if c["reused"]] == [None] * 5
    # The page: the strip's marks and the selected release's sentence.
    login(service, "alice-tok")
    page = service.get(f"/jobs/{hers}?candidate=1.0.6").text
    assert "Flaky: contradicted by a job of this trust group." in page
    assert f"flaky: contradicted by job {mine}" in page
    assert f"job {bobs}" not in page and f"job {copy}" not in page
    login(service, "bob-tok")
    page = service.get(f"/jobs/{copy}?candidate=1.0.9").text
    assert "Verdicts reused from an earlier job of this trust group." in page
    assert f"job {hers}" not in page
    page = service.get(f"/jobs/{bobs}?candidate=1.0.7").text
    assert "Flaky: contradicted by a job of this trust group." in page
    assert f"job {mine}" not in page and f"job {hers}" not in page
    # Alice's own copying job names her own source job.
    later = submit(service, ALICE, fixture_index)
    settle_service(service, later, first_leak="1.0.8")
    login(service, "alice-tok")
    sources = {c["reused_from_job"] for c in shown(service, ALICE, later)["candidates"]}
    assert sources <= {None, hers, mine} and sources - {None}
    assert bobs not in sources and copy not in sources
