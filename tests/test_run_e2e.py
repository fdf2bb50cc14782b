"""End to end: `bisect-cli run` on the offline fixture, real uv, real child processes."""

import itertools
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from packaging.version import Version

from tests.nsutil import NS_PID_EXPR, host_pid, members, still_running

EXAMPLE_REPRO = Path(__file__).resolve().parents[1] / "service" / "example" / "repro.py"
CLI = [sys.executable, "-m", "service.cli"]
# The fixture's 1.0.0..1.0.9 bisection as it ends, idle or loaded (tests/test_neighbours_e2e.py).
FIXTURE_VERDICTS = {
    "1.0.0": "clean",
    "1.0.1": None,
    "1.0.2": None,
    "1.0.3": None,
    "1.0.4": None,
    "1.0.5": "clean",
    "1.0.6": "leak",
    "1.0.7": "leak",
    "1.0.8": None,
    "1.0.9": "leak",
}


def run_args(
    range_: str, index: str, db: Path, *extra: str, script: Path = EXAMPLE_REPRO
) -> list[str]:
    """`bisect-cli run` on the fixture package, results in `db`, JSON on stdout."""
    return [
        "run", str(script), "--package", "leakyfixture", "--range", range_,
        "--index-url", index, "--database-url", f"sqlite:///{db}", "--json", *extra,
    ]  # fmt: skip


def cli(
    args: list[str], home: Path, uv_cache: Path, timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "XDG_DATA_HOME": str(home / "data"),
        "XDG_CACHE_HOME": str(home / "cache"),
        "UV_CACHE_DIR": str(uv_cache),
    }
    return subprocess.run(CLI + args, capture_output=True, text=True, env=env, timeout=timeout)


@pytest.fixture(scope="module")
def bisection(reachable_dir, fixture_index: str, uv_cache: Path):
    home = reachable_dir("home")  # its cache/ holds environments the trial user runs
    db = home / "results.db"
    proc = cli(
        run_args("1.0.0..1.0.9", fixture_index, db),
        home,
        uv_cache,
    )
    return proc, db


def test_finds_first_leaking_release(bisection) -> None:
    proc, _ = bisection
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["status"] == "found"
    assert (report["last_good"], report["first_bad"]) == ("1.0.5", "1.0.6")
    assert report["between"] == []
    assert report["skipped"] == ["1.0.4"]
    verdicts = {c["version"]: c["verdict"] for c in report["candidates"]}
    assert verdicts == FIXTURE_VERDICTS
    yanked = [c["version"] for c in report["candidates"] if c["yanked"]]
    assert yanked == ["1.0.3"]
    untestable = [c["version"] for c in report["candidates"] if not c["testable"]]
    assert untestable == ["1.0.4"]
    growth = {c["version"]: c["growth_mib"] for c in report["candidates"]}
    # 1.0.6 leaks 1 MiB a step. Its runs go to their end (the good bound's horizon, about
    # 2 s, is too short to stop early on), so the growth is over the 38 judged steps.
    bad_runs = next(e for e in report["evidence"] if e["version"] == "1.0.6")["runs"]
    assert [r["stopped_early"] for r in bad_runs] == [None, None]
    for r in bad_runs:
        host = r["analysis"]["host"]
        assert 0.8 < host["slope"] < 1.4, host
        assert host["growth_mib"] == pytest.approx(host["slope"] * host["window"], rel=1e-6)
    assert 30 < growth["1.0.6"] < 55
    assert abs(growth["1.0.5"]) < 8
    assert report["dependency_diff"] == [
        {"package": "leakyfixture", "last_good": "1.0.5", "first_bad": "1.0.6"}
    ]
    assert report["reproduce"].startswith("uv venv /tmp/leakbisect-repro")
    assert "leakyfixture==1.0.6" in report["reproduce"]
    assert report["machine"]["gpu"] is None
    # --attribute (on by default): the leak's line, found by tracemalloc.
    found = report["attribution"]
    assert (found["last_good"], found["first_bad"]) == ("1.0.5", "1.0.6")
    tm = found["tracers"]["tracemalloc"]
    assert [(s["site"], s["in_package"]) for s in tm["stacks"]] == [
        ("leakyfixture/__init__.py:22 in _touched", True)
    ]
    assert tm["stacks"][0]["frames"][:2] == [
        "leakyfixture/__init__.py:22 in _touched", "leakyfixture/__init__.py:30 in step"
    ]  # fmt: skip
    assert found["message"].startswith("grows at leakyfixture/__init__.py:22 in _touched (+")
    assert found["tracers"]["memray"]["available"] is False
    assert found["tracers"]["memray"]["note"].startswith("memray did not install: ")


def test_rows_written(bisection) -> None:
    proc, db = bisection
    assert proc.returncode == 0, proc.stderr
    con = sqlite3.connect(db)
    jobs = con.execute("select status, package, good, bad from job").fetchall()
    assert jobs == [("found", "leakyfixture", "1.0.0", "1.0.9")]
    # The good bound's pins are resolved first, by a trial of their own (never on a server).
    resolving = con.execute(
        "select t.id, c.version, t.status, t.verdict from trial t "
        "join candidate c on c.id = t.candidate_id where t.kind = 'resolve'"
    ).fetchall()
    assert resolving == [(1, "1.0.0", "done", None)]
    pins = con.execute("select pin_state, constraints from job").fetchone()
    assert (pins[0], json.loads(pins[1])) == ("resolved", ["leakyfixture==1.0.0"])
    visited = con.execute(
        "select c.version, t.verdict, t.exit_code, t.oom_killed from trial t "
        "join candidate c on c.id = t.candidate_id where t.kind = 'run' order by t.id"
    ).fetchall()
    # Bounds, binary search stepping over the untestable 1.0.4, then the boundary pair again.
    # Every run goes to its end: the good bound's full run gives a horizon of about 2 s,
    # under contract/earlystop.py's MIN_HORIZON_S, so no run is stopped early for a leak.
    assert visited == [
        ("1.0.0", "clean", 0, 0),
        ("1.0.9", "leak", 0, 0),
        ("1.0.5", "clean", 0, 0),
        ("1.0.7", "leak", 0, 0),
        ("1.0.6", "leak", 0, 0),
        ("1.0.5", "clean", 0, 0),
        ("1.0.6", "leak", 0, 0),
    ]
    # Then the boundary pair once more under memray, the cheaper tracer (--attribute, on by
    # default); the offline index has no memray, so those end at its install, with the
    # reason, and tracemalloc traces the pair instead.
    traced = con.execute(
        "select c.version, t.trace, t.verdict, t.exit_code, json_extract(t.profile, '$.error') "
        "from trial t join candidate c on c.id = t.candidate_id where t.kind = 'attribute' "
        "order by t.id"
    ).fetchall()
    no_memray = "memray did not install: "
    assert [row[:4] for row in traced] == [
        ("1.0.5", "memray", None, None), ("1.0.6", "memray", None, None),
        ("1.0.5", "tracemalloc", None, 0), ("1.0.6", "tracemalloc", None, 0),
    ]  # fmt: skip
    assert [row[4] is None or row[4].startswith(no_memray) for row in traced] == [True] * 4
    assert [row[4] is None for row in traced] == [False, False, True, True]
    counts = con.execute(
        "select t.id, t.exit_code, count(s.id), max(s.step) from trial t "
        "join memory_sample s on s.trial_id = t.id where t.kind = 'run' group by t.id"
    ).fetchall()
    assert len(counts) == 7
    for _, exit_code, samples, last_step in counts:
        # Each ran to its end: ~2 s at 10 Hz, 40 steps.
        assert exit_code == 0 and last_step is not None
        assert samples >= 15 and last_step >= 35
    evaluations = dict(con.execute("select version, evaluations from candidate").fetchall())
    assert json.loads(evaluations["1.0.6"]) == ["leak", "leak"]
    assert json.loads(evaluations["1.0.5"]) == ["clean", "clean"]
    freeze = json.loads(
        con.execute("select freeze from candidate where version = '1.0.6'").fetchone()[0]
    )
    assert freeze == ["leakyfixture==1.0.6"]


def test_second_run_reuses_verdicts(
    bisection, fixture_index: str, uv_cache: Path, reachable_tmp: Path
) -> None:
    """Same script, range, environment and classifier: judged candidates are not run again,
    but for the boundary pair's confirmation (service/reuse.py rule 4)."""
    _, db = bisection
    args = run_args("1.0.0..1.0.9", fixture_index, db)
    proc = cli(args, reachable_tmp, uv_cache)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert (report["last_good"], report["first_bad"]) == ("1.0.5", "1.0.6")
    # A copied verdict counts as one evaluation: 1.0.5 and 1.0.6 run once each (every run
    # of the first job went to its end: a 2 s horizon is too short to stop early on).
    assert [(c["version"], c["trials"]) for c in report["candidates"] if c["trials"]] == [
        ("1.0.5", 1), ("1.0.6", 1)
    ]  # fmt: skip
    assert report["trials"] == 2
    reused = [c["version"] for c in report["candidates"] if c["reused"]]
    assert reused == ["1.0.0", "1.0.5", "1.0.6", "1.0.7", "1.0.9"]
    assert "reused from job 1" in report["message"]


def test_no_reuse_runs_again(
    bisection, fixture_index: str, uv_cache: Path, reachable_tmp: Path
) -> None:
    _, db = bisection
    args = run_args("1.0.5..1.0.6", fixture_index, db, "--no-reuse")
    proc = cli(args, reachable_tmp, uv_cache)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert (report["last_good"], report["first_bad"]) == ("1.0.5", "1.0.6")
    assert report["trials"] == 4
    assert not any(c["reused"] for c in report["candidates"])


def test_threshold_above_the_leak_fails_the_bad_bound(
    fixture_index: str, uv_cache: Path, reachable_tmp: Path
) -> None:
    """--min-growth is a job setting: 40 MiB of growth is no leak under a 500 MiB threshold."""
    args = run_args(
        "1.0.5..1.0.6",
        fixture_index,
        reachable_tmp / "r.db",
        "--min-growth",
        "500",
        "--min-growth-fraction",
        "0.5",
    )
    proc = cli(args, reachable_tmp, uv_cache)
    assert proc.returncode == 3, proc.stderr
    report = json.loads(proc.stdout)
    assert report["status"] == "bounds_failed"
    assert report["message"] == (
        "bad bound 1.0.6 does not leak (clean): nothing to bisect; "
        "to map a range whose bounds agree, use --all-transitions"
    )
    assert [c["verdict"] for c in report["candidates"]] == ["clean", "clean"]


def _ignoring_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)


@pytest.mark.parametrize("inherited", ["default", "ignored"])
def test_interrupt_cancels_the_job_and_kills_the_trial(
    fixture_index: str, uv_cache: Path, reachable_tmp: Path, inherited: str
) -> None:
    """SIGINT ends the run cancelled, also when it was started with SIGINT ignored (a
    background job of a non-interactive shell, as CI starts it)."""
    script = reachable_tmp / "slow.py"
    drop = reachable_tmp / "drop"  # where the script (run as the trial user) may write
    drop.mkdir(mode=0o777)
    drop.chmod(0o777)
    pidfile = drop / "child.pid"
    script.write_text(  # its pid in its PID namespace: the test finds the host's (nsutil)
        f"import os, time\nopen({str(pidfile)!r}, 'w')"
        f".write('%s %d' % ({NS_PID_EXPR}, os.getpid()))\ntime.sleep(120)\n"
    )
    db = reachable_tmp / "r.db"
    env = {
        **os.environ,
        "XDG_DATA_HOME": str(reachable_tmp / "data"),
        "XDG_CACHE_HOME": str(reachable_tmp / "cache"),
        "UV_CACHE_DIR": str(uv_cache),
        "PYTHONFAULTHANDLER": "1",  # SIGABRT dumps every thread: where a hang is, if one
    }
    args = run_args("1.0.0..1.0.9", fixture_index, db, script=script)
    proc = subprocess.Popen(
        CLI + args, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        preexec_fn=_ignoring_sigint if inherited == "ignored" else None,
    )  # fmt: skip
    deadline = time.monotonic() + 60
    while not pidfile.exists() or len(pidfile.read_text().split()) < 2:  # written whole
        assert time.monotonic() < deadline, "the trial never started"
        time.sleep(0.2)
    ns, pid = pidfile.read_text().split()
    child = host_pid(ns, int(pid))
    assert child is not None, "the trial's script is not running"
    trial = members(ns)  # its init and its script, as the interrupt finds them
    assert child in trial
    proc.send_signal(signal.SIGINT)
    try:
        _, stderr = proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGABRT)
        _, stderr = proc.communicate(timeout=30)
        pytest.fail(f"still running 30 s after SIGINT; its threads:\n{stderr.decode()[-8000:]}")
    assert proc.returncode == 130, stderr
    assert stderr.decode().strip().endswith("interrupted: job cancelled")
    con = sqlite3.connect(db)
    assert con.execute("select status, message from job").fetchall() == [
        ("cancelled", "interrupted")
    ]
    trials = "select kind, status from trial order by id"
    assert con.execute(trials).fetchall() == [("resolve", "done"), ("run", "cancelled")]
    assert still_running(trial) == []
    assert not psutil.pid_exists(child) or psutil.Process(child).status() == psutil.STATUS_ZOMBIE


def test_find_fix_finds_the_first_release_that_stops_leaking(
    reachable_tmp: Path, uv_cache: Path
) -> None:
    from service.example.fixture import FixtureSpec, build_fixture
    from service.example.index import serve_index

    spec = FixtureSpec(first_leaking="1.0.2", fixed_in="1.0.7", yanked={}, foreign_only=None)
    wheels = build_fixture(reachable_tmp / "wheels", spec)
    with serve_index(wheels) as index:
        args = run_args("1.0.2..1.0.9", index, reachable_tmp / "r.db", "--find-fix")
        proc = cli(args, reachable_tmp, uv_cache)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["status"] == "found"
    assert (report["last_bad"], report["first_good"]) == ("1.0.6", "1.0.7")
    assert "last_good" not in report and "first_bad" not in report
    verdicts = {c["version"]: c["verdict"] for c in report["candidates"]}
    assert verdicts["1.0.2"] == "leak" and verdicts["1.0.9"] == "clean"


def test_jobs_2_finds_the_same_answer_with_the_same_verdicts(
    bisection, fixture_index: str, uv_cache: Path, reachable_tmp: Path
) -> None:
    """Two trials side by side: the planner cuts the range in more parts, the verdicts agree."""
    one = json.loads(bisection[0].stdout)  # the same job with one trial at a time
    db = reachable_tmp / "jobs2.db"
    proc = cli(run_args("1.0.0..1.0.9", fixture_index, db, "--jobs", "2", "--no-reuse"),
               reachable_tmp, uv_cache)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    two = json.loads(proc.stdout)
    assert (two["last_good"], two["first_bad"]) == ("1.0.5", "1.0.6")
    judged = {c["version"]: c["verdict"] for c in two["candidates"] if c["verdict"]}
    # The fixture's truth: clean before 1.0.6, leaking from it on; both runs agree with it.
    truth = {v: "leak" if Version(v) >= Version("1.0.6") else "clean" for v in judged}
    assert judged == truth
    assert all(truth.get(c["version"], c["verdict"]) == c["verdict"]
               for c in one["candidates"] if c["verdict"])  # fmt: skip
    # Trials overlapped: some trial started before the previous one finished.
    con = sqlite3.connect(db)
    spans = con.execute(
        "SELECT started_at, finished_at FROM trial WHERE kind = 'run' ORDER BY started_at"
    ).fetchall()
    assert any(b[0] < a[1] for a, b in itertools.pairwise(spans))


def test_jobs_out_of_range_is_one_line(reachable_tmp: Path, uv_cache: Path) -> None:
    proc = cli(["run", "--example", "--jobs", "65"], reachable_tmp, uv_cache, timeout=60)
    assert proc.returncode == 2
    assert proc.stderr == "error: --jobs: 65 is out of range; allowed are 1 to 64\n"


# Local inspection: status, list, logs and report read `run`'s database with no server.


def local(args: list[str], db: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "BISECT_SERVER"}
    return subprocess.run(
        CLI + [*args, "--database-url", f"sqlite:///{db}"],
        capture_output=True, text=True, env=env, timeout=120,
    )  # fmt: skip


def test_status_and_report_read_the_local_database(bisection) -> None:
    proc, db = bisection
    ran = json.loads(proc.stdout)
    shown = json.loads(local(["status", str(ran["job_id"]), "--json"], db).stdout)
    progress = shown.pop("progress")
    assert progress["trials_done"] == ran["trials"] and progress["trials_running"] == 0
    assert {k: v for k, v in shown.items() if k not in ("created_at", "finished_at")} == ran
    reported = json.loads(local(["report", str(ran["job_id"]), "--json"], db).stdout)
    assert {k: v for k, v in reported.items() if k in ran} == ran
    markdown = local(["report", str(ran["job_id"]), "--markdown"], db)
    assert markdown.returncode == 0
    assert "**first bad 1.0.6, last good 1.0.5, confirmed twice**" in markdown.stdout


def test_list_and_logs_read_the_local_database(bisection) -> None:
    proc, db = bisection
    job_id = json.loads(proc.stdout)["job_id"]
    page = json.loads(local(["list", "--json"], db).stdout)
    assert [(j["id"], j["status"], j["url"]) for j in page["items"]][-1] == (job_id, "found", None)
    con = sqlite3.connect(db)
    rows = con.execute(
        "SELECT trial.number, candidate.version FROM trial JOIN candidate ON candidate.id = "
        "trial.candidate_id WHERE trial.job_id = ? AND trial.kind = 'run' ORDER BY trial.id",
        (job_id,),
    ).fetchall()
    trial, version = rows[0]
    logs = local(["logs", str(job_id), str(trial)], db)
    assert logs.returncode == 0
    assert logs.stderr.startswith(f"trial {trial} of job {job_id} ({version}): done, clean; ")


def test_local_reads_say_what_is_missing(bisection) -> None:
    _, db = bisection
    missing = local(["status", "999999"], db)
    assert (missing.returncode, missing.stderr) == (2, "error: job 999999 not found\n")
    both = local(["status", "1", "--server", "http://127.0.0.1:9"], db)
    assert both.returncode == 2
    assert both.stderr == (
        "error: --database-url: reads a local database; drop it or --server/BISECT_SERVER\n"
    )


@pytest.mark.skipif(os.geteuid() != 0, reason="a build user of its own needs root")
def test_as_root_a_uv_cache_dir_of_roots_own_is_replaced_and_the_run_goes_on(
    reachable_tmp: Path, tmp_path: Path
) -> None:
    """Issue 28: as root with UV_CACHE_DIR on a cache only root can reach (under pytest's
    0700 temporary directory, as under /root), `run` builds in leakbisect's own cache and
    says so in one line, instead of failing every run."""
    from runners.users import identities

    roots = tmp_path / "uv"  # tmp_path's parents are 0700: the build user cannot reach it
    args = ["run", "--example", "--json", "--no-attribute",
            "--database-url", f"sqlite:///{reachable_tmp / 'r.db'}"]  # fmt: skip
    proc = cli(args, reachable_tmp, roots)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(proc.stdout)["first_bad"] == "1.0.6"
    own = reachable_tmp / "cache" / "leakbisect" / "uv"
    said = [line for line in proc.stderr.splitlines() if "UV_CACHE_DIR" in line]
    assert said == [
        f"UV_CACHE_DIR {roots} is not usable by the build user, {identities().build}; builds use "
        f"leakbisect's own uv cache {own} instead"
    ]
    assert own.is_dir() and not (roots.exists() and any(roots.iterdir()))  # nothing built there
