"""The Docker executor on a real engine: real containers of the runner image, real uv.

Marked ``docker``: skipped with the reason where there is no engine or image, failed in
CI (tests/docker_util.py).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import socket
import subprocess
import sys
import tarfile
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from docker.errors import NotFound

from contract.outbound import Reach
from contract.sources import source_ref
from contract.wire import Cause, CommitRange, EnvSpec, Failure, TrialReport, TrialSpec
from engine.analysis import classify_run
from runners import tracing
from runners.docker.executor import LOCAL_CLONE, DockerExecutor, _profile
from runners.docker.spec import LABEL_RUNNER, LABEL_TRIAL, TRIAL_UID
from service.example.gitrepo import _git, build_repo, serve_repo
from service.example.index import serve_index
from tests.docker_util import RUNNER_IMAGE, engine

pytestmark = pytest.mark.docker
MiB = 1 << 20
CLI = [sys.executable, "-m", "service.cli"]


@pytest.fixture(scope="module")
def client() -> Any:
    return engine()


@pytest.fixture
def executor(client: Any, request: pytest.FixtureRequest) -> Iterator[DockerExecutor]:
    name = f"test-{request.node.name[:40]}-{os.getpid()}"
    ex = DockerExecutor.from_env(runner_name=name, image=RUNNER_IMAGE,
                                 cache_volume="leakbisect-test-cache")  # fmt: skip
    yield ex
    ex.remove_leftovers()


def trial(index: str, script: str, version: str = "1.0.0", **kw: Any) -> TrialSpec:
    env = EnvSpec(package="leakyfixture", version=version, index_url=index)
    return TrialSpec(trial_id=kw.pop("trial_id", 1), env=env, script=textwrap.dedent(script),
                     **kw)  # fmt: skip


def cli(args: list[str], home: Path, uv_cache: Path, timeout: float = 600
        ) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "XDG_DATA_HOME": str(home / "data"),
           "XDG_CACHE_HOME": str(home / "cache"), "UV_CACHE_DIR": str(uv_cache)}  # fmt: skip
    return subprocess.run(CLI + args, capture_output=True, text=True, env=env, timeout=timeout)


def visited(report: dict[str, Any]) -> list[tuple[str, str | None]]:
    """The candidates that ran, with their verdicts (an inconclusive run may repeat one)."""
    return [(c["version"], c["verdict"]) for c in report["candidates"] if c["trials"]]


def test_example_finds_1_0_6_visiting_the_same_candidates_as_local(
    reachable_tmp: Path, uv_cache: Path
) -> None:
    results = {}
    for kind in ("local", "docker"):
        db = reachable_tmp / f"{kind}.db"
        args = ["run", "--example", "--json", "--executor", kind, "--database-url", f"sqlite:///{db}"]
        proc = cli(args, reachable_tmp / kind, uv_cache)
        assert proc.returncode == 0, proc.stderr[-2000:]
        results[kind] = json.loads(proc.stdout)
    assert results["docker"]["status"] == "found"
    assert results["docker"]["first_bad"] == "1.0.6"
    assert results["docker"]["last_good"] == "1.0.5"
    assert visited(results["docker"]) == visited(results["local"])
    # The boundary pair's leaking runs go to their end in a container as in a process (the
    # fixture's 2 s horizon is under contract/earlystop.py's MIN_HORIZON_S), and both
    # executors report the horizon each run was sent and the leak looks it tested (none).
    for kind in ("local", "docker"):
        bad = next(e for e in results[kind]["evidence"] if e["version"] == "1.0.6")
        assert [r["stopped_early"] for r in bad["runs"]] == [None, None], kind
        assert [r["exit_code"] for r in bad["runs"]] == [0, 0], kind
        records = [r["analysis"]["early_stop"] for r in bad["runs"]]
        assert all(rec["looks"] == 0 and 0 < rec["horizon_s"] < 60 for rec in records), records
        assert [rec["horizon_steps"] for rec in records] == [40, 40], kind


@pytest.fixture
def listener() -> Iterator[tuple[int, list[str]]]:
    """A TCP listener on 127.0.0.1 recording who connected."""
    server = socket.create_server(("127.0.0.1", 0))
    seen: list[str] = []

    def accept() -> None:
        while True:
            try:
                conn, addr = server.accept()
            except OSError:
                return
            seen.append(f"{addr[0]}:{addr[1]}")
            conn.close()

    threading.Thread(target=accept, daemon=True).start()
    yield server.getsockname()[1], seen
    server.close()


def test_run_phase_cannot_reach_127_0_0_1_while_the_build_phase_could(
    executor: DockerExecutor, fixture_index: str, listener: tuple[int, list[str]]
) -> None:
    port, seen = listener
    script = f"""
        import socket, sys
        try:
            socket.create_connection(("127.0.0.1", {port}), timeout=3)
        except OSError as exc:
            print("blocked:", type(exc).__name__)
            sys.exit(0)
        print("connected")
        sys.exit(3)
    """
    report = executor.run_trial(trial(fixture_index, script))
    # The build phase installed leakyfixture from the index this test serves on 127.0.0.1.
    assert fixture_index.startswith("http://127.0.0.1:")
    assert report.env.ok, report.env.error
    assert report.env.freeze == ["leakyfixture==1.0.0"]
    assert report.exit_code == 0, report.log_tail
    assert "blocked:" in report.log_tail
    assert seen == []


LEAK = """
    import time
    hold = []
    while True:
        print("::leakbisect-step::", flush=True)
        hold.append(bytearray(8 << 20))
        for b in hold[-1:]:
            b[::4096] = b"x" * len(b[::4096])
        time.sleep(0.05)
"""


def verdict(report: TrialReport) -> str:
    run = classify_run(
        [s.t for s in report.samples], [s.rss for s in report.samples], None, report.steps,
        exit_code=report.exit_code, oom_killed=report.oom_killed, timed_out=report.timed_out,
    )  # fmt: skip
    return str(run.verdict)


def test_a_leak_under_200_mib_is_oom_killed_in_its_container_and_judged_leak(
    executor: DockerExecutor, fixture_index: str
) -> None:
    report = executor.run_trial(trial(fixture_index, LEAK, memory_limit_bytes=200 * MiB,
                                      timeout_s=120))  # fmt: skip
    assert report.oom_killed is True
    assert report.exit_code == -9
    assert report.timed_out is False
    assert report.cap_method in ("docker-cgroup-v1", "docker-cgroup-v2")
    assert max(s.rss for s in report.samples) <= 200 * MiB
    assert max(s.rss for s in report.samples) > 100 * MiB
    assert verdict(report) == "leak"
    assert executor.leftovers() == []  # and this process, the runner, is still here


def test_the_script_sees_no_bisect_variable_no_token_and_no_privilege(
    executor: DockerExecutor, fixture_index: str, monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    secret = "tok-" + os.urandom(8).hex()
    monkeypatch.setenv("BISECT_RUNNER_TOKEN", secret)
    monkeypatch.setenv("BISECT_DATABASE_URL", f"postgresql://u:{secret}@db/x")
    (tmp_path / "token").write_text(secret)
    monkeypatch.setenv("BISECT_RUNNER_TOKEN_FILE", str(tmp_path / "token"))
    script = f"""
        import json, os
        secret = ("{secret[:6]}" + "{secret[6:]}").encode()  # not whole in this file
        found = []
        for top in ("/etc", "/opt", "/trial", "/tmp", "/var", "/home", "/root", "/run"):
            for d, _dirs, files in os.walk(top):
                for f in files:
                    p = os.path.join(d, f)
                    try:
                        if os.path.getsize(p) < 1 << 20 and secret in open(p, "rb").read():
                            found.append(p)
                    except OSError:
                        pass
        status = dict(l.split(":\\t", 1) for l in open("/proc/self/status") if ":\\t" in l)
        try:
            open("/etc/leakbisect-probe", "w")
            writable = True
        except OSError:
            writable = False
        print(json.dumps({{"env": dict(os.environ), "found": found, "uid": os.getuid(),
                          "cap_eff": status["CapEff"].strip(), "root_writable": writable}}))
    """
    report = executor.run_trial(trial(fixture_index, script, variables={"MY_FLAG": "1"}))
    assert report.exit_code == 0, report.log_tail
    seen = json.loads(report.log_tail.strip().splitlines()[-1])
    assert [k for k in seen["env"] if k.upper().startswith("BISECT_")] == []
    assert not any(secret in v for v in seen["env"].values())
    assert seen["env"]["MY_FLAG"] == "1"
    assert seen["env"]["HOME"] == "/trial/work/home"
    assert seen["found"] == []
    assert seen["uid"] == TRIAL_UID
    assert seen["cap_eff"] == "0000000000000000"
    assert seen["root_writable"] is False


def test_a_starting_executor_removes_its_own_leftovers_only(client: Any) -> None:
    mine = f"leftover-{os.getpid()}"
    other = f"other-{os.getpid()}"
    made = [
        client.containers.create(RUNNER_IMAGE, ["sleep", "600"], network_mode="none",
                                 labels={LABEL_RUNNER: who, LABEL_TRIAL: "7.1"})
        for who in (mine, other)
    ]  # fmt: skip
    made[0].start()
    try:
        ex = DockerExecutor.from_env(runner_name=mine, image=RUNNER_IMAGE)
        assert ex.leftovers() == []
        label = f"{LABEL_RUNNER}={other}"
        assert [c.id for c in client.containers.list(all=True, filters={"label": label})] == [
            made[1].id
        ]
    finally:
        for c in made:
            with contextlib.suppress(NotFound):  # the executor removed it
                c.remove(force=True)


def test_kill_ends_a_running_trial_and_leaves_no_container(
    executor: DockerExecutor, fixture_index: str
) -> None:
    started = threading.Event()
    kills: list[Any] = []

    def on_sample(_s: object) -> None:
        started.set()

    def killer() -> None:
        started.wait(120)
        kills[0]()

    threading.Thread(target=killer, daemon=True).start()
    report = executor.run_trial(
        trial(fixture_index, "import time\nwhile True: time.sleep(0.1)\n", timeout_s=300),
        on_start=kills.append, on_sample=on_sample,
    )  # fmt: skip
    assert report.exit_code == -9
    assert report.oom_killed is False
    assert executor.leftovers() == []


def _runner(svc: Any, name: str) -> subprocess.Popen:
    log = svc.home / f"{name}.log"
    with log.open("a") as err:
        proc = subprocess.Popen(
            CLI + ["runner", "--server", svc.url, "--name", name, "--grace", "2",
                   "--executor", "docker", "--image", RUNNER_IMAGE,
                   "--cache-volume", "leakbisect-test-cache"],
            stdout=subprocess.DEVNULL, stderr=err, env=svc.env,
        )  # fmt: skip
    svc.runners.append(proc)
    svc.logs.append(log)
    return proc


def test_sigkilled_runner_its_container_goes_at_restart_and_the_trial_is_relet(
    client: Any, tmp_path: Path, reachable_tmp: Path, uv_cache: Path, fixture_index: str
) -> None:
    from tests.test_cli_service import REPRO, Service, leased_trial, make_env, wait_until

    name = f"doomed-{os.getpid()}"
    label = {"label": [f"{LABEL_RUNNER}={name}", "leakbisect.phase=run"]}
    svc = Service(tmp_path, make_env(tmp_path, reachable_tmp, uv_cache))
    svc.start_serve(f"sqlite:///{tmp_path / 'svc.db'}", BISECT_LEASE_S="3")
    submit: subprocess.Popen | None = None
    try:
        first = _runner(svc, name)
        submit = subprocess.Popen(
            CLI + ["submit", str(REPRO), "--package", "leakyfixture", "--range", "1.0.5..1.0.7",
                   "--index-url", fixture_index, "--wait", "--json", "--server", svc.url],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=svc.env,
        )  # fmt: skip
        with svc.client() as api:
            job = wait_until(lambda: api.list_jobs()["items"], 60, "the job")[0]["id"]
            trial = wait_until(lambda: leased_trial(api, job), 60, "a leased trial")
            orphan = wait_until(lambda: client.containers.list(filters=label), 120, "its run")
            first.send_signal(signal.SIGKILL)
            first.wait(10)
            assert [c.id for c in client.containers.list(filters=label)] == [orphan[0].id]
            _runner(svc, name)  # the same name: it removes what the dead one left
            wait_until(lambda: orphan[0].id not in _ids(client, label), 60, "the orphan gone")
            out, err = submit.communicate(timeout=300)
            assert submit.returncode == 0, err + "".join(p.read_text() for p in svc.logs)
            report = json.loads(out)
            assert (report["last_good"], report["first_bad"]) == ("1.0.5", "1.0.6")
            relet = api.get_trial(trial["id"])
            assert relet["attempt"] == 2 and relet["status"] == "done"
    finally:
        if submit is not None and submit.poll() is None:
            submit.kill()
        svc.stop()
    all_label = {"label": f"{LABEL_RUNNER}={name}"}
    assert client.containers.list(all=True, filters=all_label) == []


def _ids(client: Any, filters: dict[str, Any]) -> list[str]:
    # sparse: the list as the engine gave it. The default inspects each container after
    # listing it, and one removed in between (what the caller waits for) raised NotFound.
    return [c.id for c in client.containers.list(all=True, filters=filters, sparse=True)]


def test_a_missing_image_or_cgroup_root_is_one_line_and_exit_1(
    client: Any, tmp_path: Path
) -> None:
    base = ["runner", "--executor", "docker", "--server", "http://127.0.0.1:9"]
    proc = cli([*base, "--image", "leakbisect-no-such:image"], tmp_path, tmp_path / "uv")
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines() == [
        "error: --image: runner image leakbisect-no-such:image not found; build it with "
        "dockerfiles/build-base.sh && uv run python -m runners.docker.images"
    ]
    proc = cli([*base, "--cgroup-root", str(tmp_path)], tmp_path, tmp_path / "uv")
    assert proc.returncode == 1
    assert proc.stderr.strip() == f"error: --cgroup-root: {tmp_path} is not a cgroup v1 or v2 mount"


def test_a_trial_past_its_timeout_is_killed_in_its_container(
    executor: DockerExecutor, fixture_index: str
) -> None:
    report = executor.run_trial(
        trial(fixture_index, "import time\nwhile True: time.sleep(0.1)\n", timeout_s=3)
    )
    assert report.timed_out is True
    assert report.exit_code == -9
    assert report.oom_killed is False
    assert 3 <= report.duration_s < 60
    assert executor.leftovers() == []


def test_serve_with_embedded_docker_runners_finds_the_first_leak(
    client: Any, tmp_path: Path, reachable_tmp: Path, uv_cache: Path, fixture_index: str
) -> None:
    from tests.test_cli_service import REPRO, Service, make_env

    svc = Service(tmp_path, make_env(tmp_path, reachable_tmp, uv_cache))
    svc.start_serve(f"sqlite:///{tmp_path / 'svc.db'}", "--runners", "1", "--executor",
                    "docker", "--image", RUNNER_IMAGE, "--cache-volume",
                    "leakbisect-test-cache")  # fmt: skip
    try:
        proc = svc.cli("submit", str(REPRO), "--package", "leakyfixture", "--range",
                       "1.0.5..1.0.7", "--index-url", fixture_index, "--wait", "--json",
                       timeout=300)  # fmt: skip
        assert proc.returncode == 0, proc.stderr + (tmp_path / "serve.log").read_text()
        report = json.loads(proc.stdout)
        assert (report["last_good"], report["first_bad"]) == ("1.0.5", "1.0.6")
    finally:
        assert svc.stop() == 0
    # The embedded runner ran its trials in containers: none is left.
    assert client.containers.list(all=True, filters={"label": "leakbisect.phase=run"}) == []


REPRO_SCRIPT = (Path(__file__).parent.parent / "service" / "example" / "repro.py").read_text()
LEAK_FRAMES = [
    ["repro.py", 36, "<module>"],
    ["repro.py", 24, "main"],
    ["leakyfixture/__init__.py", 30, "step"],
    ["leakyfixture/__init__.py", 22, "_touched"],
]


def test_an_attribute_trial_under_tracemalloc_profiles_the_leaking_line_in_its_container(
    executor: DockerExecutor, fixture_index: str
) -> None:
    spec = trial(fixture_index, REPRO_SCRIPT, version="1.0.6", kind="attribute",
                 trace="tracemalloc", timeout_s=120)  # fmt: skip
    report = executor.run_trial(spec)
    assert report.env.ok, report.env.error
    assert report.env.freeze == ["leakyfixture==1.0.6"]  # nothing added for tracemalloc
    assert report.exit_code == 0, report.log_tail
    assert [n for _t, n in report.steps] == list(range(1, 41))  # the helper passes them on
    profile = report.attribution
    assert profile is not None
    assert (profile["tracer"], profile["error"]) == ("tracemalloc", None)
    assert len(profile["snapshots"]) == len(profile["stacks"][0]["sizes"]) >= 2
    # The stack that grew most is the leak's: frames outermost first, the allocating line
    # last; at the end it holds all 40 retained MiB (each bytearray with its 57-byte header).
    grown = profile["stacks"][0]
    assert grown["frames"] == LEAK_FRAMES
    assert grown["sizes"][-1] == 40 * (MiB + 57)
    assert grown["sizes"] == sorted(grown["sizes"])
    innermost = [s["frames"][-1] for s in profile["stacks"]]
    assert ["leakyfixture/__init__.py", 22, "_touched"] in innermost
    assert executor.leftovers() == []


def test_an_attribute_trial_killed_before_its_end_reports_that_it_wrote_no_profile(
    executor: DockerExecutor, fixture_index: str
) -> None:
    forever = "import time\nwhile True: time.sleep(0.1)\n"
    spec = trial(fixture_index, forever, kind="attribute", trace="tracemalloc", timeout_s=3)
    report = executor.run_trial(spec)
    assert report.timed_out is True
    assert report.exit_code == -9
    assert report.attribution == {
        "error": "the traced run wrote no profile (it was killed or exited early)"
    }
    assert executor.leftovers() == []


def test_a_memray_trial_whose_env_cannot_install_memray_says_so_in_its_attribution(
    executor: DockerExecutor, fixture_index: str
) -> None:
    spec = trial(fixture_index, REPRO_SCRIPT, version="1.0.6", kind="attribute", trace="memray")
    report = executor.run_trial(spec)
    # The offline fixture index has no memray: the build fails, nothing runs.
    assert report.env.ok is False
    assert report.exit_code is None
    assert report.samples == []
    assert report.error is None
    assert report.env.error is not None
    assert "Because memray was not found in the package registry" in report.env.error
    assert report.attribution == tracing.not_installed("memray", report.env.error)
    assert report.attribution["tracer"] == "memray"
    assert report.attribution["error"].startswith("memray did not install: ")
    assert executor.leftovers() == []


class _Archived:
    """A stopped container as `runners.docker.executor._profile` sees it: `get_archive` only."""

    def __init__(self, member: tarfile.TarInfo | None, data: bytes = b"") -> None:
        self.member, self.data = member, data

    def get_archive(self, path: str) -> tuple[Iterator[bytes], dict[str, Any]]:
        if self.member is None:
            raise NotFound(path)
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tar:
            tar.addfile(self.member, io.BytesIO(self.data) if self.member.isfile() else None)
        return iter([buf.getvalue()]), {"size": self.member.size}


def _file(data: bytes) -> _Archived:
    info = tarfile.TarInfo(tracing.PROFILE_NAME)
    info.size = len(data)
    return _Archived(info, data)


def test_a_profile_copied_out_is_read_as_the_local_executor_reads_one() -> None:
    cap = tracing.MAX_PROFILE_BYTES
    assert _profile(_file(b'{"tracer": "tracemalloc", "error": null}')) == {
        "tracer": "tracemalloc", "error": None,
    }  # fmt: skip
    assert _profile(_Archived(None)) == {
        "error": "the traced run wrote no profile (it was killed or exited early)"
    }
    assert _profile(_file(b" " * (cap + 1))) == {
        "error": f"the profile is {cap + 1} bytes; at most {cap}"
    }
    assert _profile(_file(b"[1]")) == {"error": "the profile is not an object"}
    assert _profile(_file(b"{")) == {"error": "the profile could not be read: Expecting "
                                     "property name enclosed in double quotes: line 1 column "
                                     "2 (char 1)"}  # fmt: skip
    link = tarfile.TarInfo(tracing.PROFILE_NAME)
    link.type, link.linkname = tarfile.SYMTYPE, "/etc/passwd"
    assert _profile(_Archived(link)) == {
        "error": "the profile could not be read: it is not a plain file"
    }


def test_a_commits_trial_lists_in_its_build_container_and_commits_build_there(
    executor: DockerExecutor, fixture_index: str, reachable_dir: Any
) -> None:
    """--commits on a Docker runner: the listing and the build from a commit both happen in
    build containers (host network: the repository on 127.0.0.1); the script runs in a
    run container with no network, the package built from the leaking commit."""
    repo = build_repo(reachable_dir("docker-git") / "repo")
    tagged = _git(repo.path, "rev-parse", "v1.0.5^{commit}")
    with serve_repo(repo.path) as url:
        wanted = CommitRange(repo=url, package="leakyfixture", good="1.0.5", bad="1.0.6")
        listing = executor.run_trial(trial(fixture_index, "", kind="commits",
                                           commit_range=wanted))  # fmt: skip
        source = source_ref(url, repo.leaking_sha)
        env = EnvSpec(package="leakyfixture", version="1.0.6", source=source)
        probe = "import leakyfixture as m; print(m.__version__, m.LEAKS)\n"
        built = executor.run_trial(TrialSpec(trial_id=2, env=env, script=probe))
    assert (listing.env.ok, listing.env.error, listing.exit_code) == (True, None, None)
    assert [(c.sha, c.subject) for c in listing.commits or []] == [
        (tagged, "release 1.0.5"), *repo.commits
    ]  # fmt: skip
    assert built.env.ok, built.env.error
    assert built.env.freeze == [f"leakyfixture @ {source}"]
    assert (built.exit_code, built.log_tail) == (0, "1.0.6.dev7 True\n")
    assert executor.leftovers() == []


def test_a_local_clone_is_refused_before_any_container_starts(
    executor: DockerExecutor, fixture_index: str, tmp_path: Path
) -> None:
    for repo in (str(tmp_path), tmp_path.as_uri()):
        wanted = CommitRange(repo=repo, package="leakyfixture", good="1.0.5", bad="1.0.6")
        report = executor.run_trial(trial(fixture_index, "", kind="commits", commit_range=wanted))
        assert (report.env.ok, report.env.error, report.commits) == (False, LOCAL_CLONE, None)
    assert executor.leftovers() == []


def test_a_build_the_egress_rule_refuses_is_the_infrastructure_s_in_a_container(
    executor: DockerExecutor, fixture_wheels: Path
) -> None:
    """The build container runs the same build phase (runners/kinds.py), its egress proxy
    inside it: the index is listed, its files' port is not, and the report says so typed
    (issue 35 item 4), never as the release's failure."""
    with serve_index(fixture_wheels) as files:
        port = files.split(":")[2].split("/")[0]
        with serve_index(fixture_wheels, files_at=f"http://127.0.0.1:{port}/files/") as index:
            env = EnvSpec(package="leakyfixture", version="1.0.0", index_url=index,
                          reach=Reach(hosts=(index.split("/")[2],)))  # fmt: skip
            report = executor.run_trial(TrialSpec(trial_id=1, env=env, script="pass\n"))
    rule, host = "host 127.0.0.1 is not in BISECT_ALLOWED_INDEXES", f"127.0.0.1:{port}"
    refused = Failure(cause=Cause.REFUSED, host=host, rule=rule,
                      message=f"the job's outbound rule refused {host}: {rule}")  # fmt: skip
    assert (report.env.ok, report.env.error, report.exit_code) == (False, refused.message, None)
    assert report.infrastructure == refused
    assert executor.leftovers() == []
