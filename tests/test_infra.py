"""Why a build failed, told apart (issue 35, item 4): the infrastructure's causes, retried and
never a verdict, against the release's own (no resolution, no distribution for the platform,
a failed build) and the script's exit 125, each a skip that says which.

Real parts: uv against the offline fixture index on 127.0.0.1, the egress proxy judging real
connections to loopback listeners, the supervisor's own timeout, ``/dev/full`` for a full
disk. uv's words for failures that take uv seconds of retries (a 503, a refused
connection) are its own, captured from uv 0.9 and 0.13; those this machine cannot make uv
say (a full disk under uv, a read that times out) are written in uv's form.
"""

from __future__ import annotations

import errno
import socket
import subprocess
from pathlib import Path

import pytest

from contract.outbound import Reach
from contract.wire import Cause, EnvResult, EnvSpec, Failure, TrialReport
from engine.verdicts import Verdict
from runners import envs, uvrun
from runners.egress import Egress
from runners.supervise import run
from service.models import Job, Trial
from service.trials import ending_failure, judge
from tests.sdist import write_sdist
from tests.test_outbound import UV_NOT_FOUND, UV_REFUSED, listener

RULE = "host 127.0.0.1 is not in BISECT_ALLOWED_INDEXES"
UV_503 = """\
error: Request failed after 3 retries in 9.8s
  cause: Failed to fetch: http://127.0.0.1:44033/simple/leakyfixture/
  cause: HTTP status server error (503 Service Unavailable) for url (http://127.0.0.1:44033/simple/leakyfixture/)
"""
UV_NO_SPACE = """\
error: Failed to install: leakyfixture-1.0.0-py3-none-any.whl (leakyfixture==1.0.0)
  Caused by: failed to write to file `/envs/site-packages/leakyfixture.py`
  Caused by: No space left on device (os error 28)
"""
UV_READ_TIMEOUT = """\
error: Failed to fetch: `http://127.0.0.1:8/simple/leakyfixture/`
  Caused by: error sending request for url (http://127.0.0.1:8/simple/leakyfixture/)
  Caused by: operation timed out
"""


def failed(stderr: str, code: int = 2) -> subprocess.CompletedProcess[str]:
    return subprocess.CompletedProcess(["uv"], code, "", stderr)


def ask(proxy: Egress, head: str) -> bytes:
    port = int(proxy.url.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port)) as client:
        client.sendall(head.encode())
        return client.recv(100)


# ------------------------------------------------------------------ the infrastructure's


def test_the_proxy_s_refusal_comes_first_and_names_the_host_and_the_rule() -> None:
    """uv's words say an HTTP 403 (the proxy's answer): the refusal the proxy recorded is
    the cause, with the host:port uv asked for and the rule's words."""
    with listener() as (port, accepted), Egress(Reach(hosts=("127.0.0.1:1",))) as proxy:
        assert ask(proxy, f"GET http://127.0.0.1:{port}/files/x.whl HTTP/1.1\r\n\r\n")[:12] == (
            b"HTTP/1.1 403"
        )
    assert accepted == []  # refused before anything connected
    stderr = f"error: Failed to fetch: http://127.0.0.1:{port}/files/x.whl\n  cause: HTTP 403"
    for ruled in (True, False):
        assert uvrun.classify(failed(stderr), proxy, ruled=ruled) == Failure(
            cause=Cause.REFUSED,
            host=f"127.0.0.1:{port}",
            rule=RULE,
            message=f"the job's outbound rule refused 127.0.0.1:{port}: {RULE}",
        )


def test_a_host_the_rule_allows_and_that_does_not_answer_is_unreachable() -> None:
    with listener() as (port, _):
        pass  # the port is free again: nothing listens on it
    with Egress(Reach(hosts=(f"127.0.0.1:{port}",))) as proxy:
        assert ask(proxy, f"CONNECT 127.0.0.1:{port} HTTP/1.1\r\n\r\n")[:12] == b"HTTP/1.1 502"
    assert proxy.refusals == [] and proxy.unreachable == [f"127.0.0.1:{port}"]
    found = uvrun.classify(failed("error: Failed to fetch"), proxy, ruled=True)
    line = f"127.0.0.1:{port} could not be reached from the runner"
    assert found == Failure(cause=Cause.UNREACHABLE, host=f"127.0.0.1:{port}", message=line)


@pytest.mark.parametrize(
    ("stderr", "ruled", "cause", "message"),
    [
        (UV_503, True, Cause.INDEX_ERROR, "an index or a file it lists answered HTTP 503"),
        (UV_503, False, Cause.INDEX_ERROR,
         "an index or a file it lists answered HTTP 503: Failed to fetch: "
         "http://127.0.0.1:44033/simple/leakyfixture/: HTTP status server error (503 Service "
         "Unavailable) for url (http://127.0.0.1:44033/simple/leakyfixture/)"),
        (UV_REFUSED, True, Cause.UNREACHABLE, uvrun.FETCH_FAILED),
        (UV_REFUSED, False, Cause.UNREACHABLE,
         "uv could not fetch: Failed to fetch: http://127.0.0.1:1/simple/leakyfixture/: "
         "Connection refused (os error 111)"),
        (UV_READ_TIMEOUT, True, Cause.TIMED_OUT, "a request uv made timed out"),
        (UV_NO_SPACE, True, Cause.DISK_FULL, "no space left on the runner's device"),
    ],
)  # fmt: skip
def test_uv_s_words_for_a_failed_request_are_the_infrastructure_s(
    stderr: str, ruled: bool, cause: Cause, message: str
) -> None:
    """Under a rule (a served job) the job is told the cause and an HTTP status, never uv's
    words (which name where a redirect led); the user's own job gets uv's words too."""
    found = uvrun.classify(failed(stderr), None, ruled=ruled)
    assert found == Failure(cause=cause, message=message)
    assert found.cause.infrastructure


def test_the_supervisor_s_timeout_is_uv_timing_out(tmp_path: Path) -> None:
    proc = run(["sleep", "30"], env={}, cwd=tmp_path, run_as=None, timeout=0.5)
    assert proc.returncode == 124
    found = uvrun.classify(proc, None, ruled=True)
    assert found == Failure(cause=Cause.TIMED_OUT, message="sleep timed out after 0 s")
    assert found.cause.infrastructure


def test_a_full_disk_on_the_runner_is_the_infrastructure_s() -> None:
    with pytest.raises(OSError) as full, open("/dev/full", "w") as device:  # noqa: PTH123
        device.write("x")
        device.flush()
    assert full.value.errno == errno.ENOSPC
    found = Failure.from_exception(full.value)
    assert found == Failure(cause=Cause.DISK_FULL,
                            message="no space left on the runner's device")  # fmt: skip
    named = OSError(errno.ENOSPC, "No space left on device", "/var/cache/leakbisect/envs/x")
    assert Failure.from_exception(named).message == (  # type: ignore[union-attr]
        "no space left on the runner's device (/var/cache/leakbisect/envs/x)"
    )
    assert Failure.from_exception(PermissionError(errno.EACCES, "denied")) is None
    assert Failure.from_exception(ValueError("x")) is None


# ------------------------------------------------------------------ the release's


@pytest.mark.parametrize(
    ("version", "cause", "reason"),
    [
        ("9.9.9", Cause.NO_RESOLUTION,
         "Because there is no version of leakyfixture==9.9.9 and you require "
         "leakyfixture==9.9.9, we can conclude that your requirements are unsatisfiable."),
        ("1.0.4", Cause.NO_DISTRIBUTION, "Because leakyfixture==1.0.4 has no wheels with a "
         "matching platform tag"),
    ],
)  # fmt: skip
def test_an_environment_that_truly_cannot_be_built_is_the_release_s(
    reachable_tmp: Path, fixture_index: str, version: str, cause: Cause, reason: str
) -> None:
    host = fixture_index.split("/")[2]
    spec = EnvSpec(package="leakyfixture", version=version, index_url=fixture_index,
                   reach=Reach(hosts=(host,)))  # fmt: skip
    result = envs.build_env(spec, root=reachable_tmp / "envs", cache_dir=reachable_tmp / "c")
    assert result.ok is False and result.failure is not None
    assert (result.failure.cause, result.failure.host, result.failure.rule) == (cause, None, None)
    assert result.failure.message.startswith(reason)
    assert not result.failure.cause.infrastructure
    assert "No solution found" in (result.error or "")  # uv's own words: nothing to withhold


def test_a_release_whose_sdist_does_not_build_is_the_release_s(reachable_tmp: Path) -> None:
    from service.example.index import serve_index

    links = reachable_tmp / "sdist"
    write_sdist(links, reachable_tmp / "marker")
    with serve_index(links) as index:
        spec = EnvSpec(package="evilbuild", version="1.0", index_url=index,
                       reach=Reach(hosts=(index.split("/")[2],)))  # fmt: skip
        result = envs.build_env(spec, root=reachable_tmp / "envs", cache_dir=reachable_tmp / "c")
    assert result.failure == Failure(cause=Cause.BUILD_FAILED,
                                     message="Failed to build `evilbuild==1.0`")  # fmt: skip
    assert not result.failure.cause.infrastructure


def test_words_that_say_no_cause_are_none_and_no_solution_is_no_resolution() -> None:
    assert uvrun.classify(failed("error: something else went wrong"), None, ruled=True) is None
    found = uvrun.classify(failed(UV_NOT_FOUND, 1), None, ruled=True)
    assert found is not None and found.cause is Cause.NO_RESOLUTION


# ------------------------------------------------------------------ reports and verdicts


def test_a_report_is_an_infrastructure_failure_by_either_of_its_failures() -> None:
    refused = Failure(cause=Cause.REFUSED, host="127.0.0.1:9", rule=RULE, message="refused")
    full = Failure(cause=Cause.DISK_FULL, message="full")
    unbuilt = Failure(cause=Cause.NO_RESOLUTION, message="no")
    env = EnvResult(ok=False, failure=refused)
    assert TrialReport(trial_id=1, env=env).infrastructure == refused
    assert TrialReport(trial_id=1, env=EnvResult(ok=True), failure=full).infrastructure == full
    assert TrialReport(trial_id=1, env=EnvResult(ok=False, failure=unbuilt)).infrastructure is None
    assert (
        TrialReport(trial_id=1, env=EnvResult(ok=False, error="old runner")).infrastructure is None
    )


def test_the_script_s_exit_125_is_its_own_skip_and_says_so() -> None:
    job = Job(package="p", good="1", bad="2", script="", script_sha256="0", classifier={})
    report = TrialReport(trial_id=1, env=EnvResult(ok=True), exit_code=125)
    verdict, analysis = judge(job, report)
    assert verdict is Verdict.SKIP
    assert (analysis["cause"], analysis["skipped"]) == (
        "exit-125",
        "its script exited 125 (the script's own skip: it cannot test it)",
    )
    crashed = report.model_copy(update={"exit_code": 1})
    assert "skipped" not in judge(job, crashed)[1]


def test_only_a_trial_that_decides_ends_the_job_on_its_infrastructure_failures() -> None:
    """A traced run is never a verdict: its spent failures end its tracing, not the job."""
    failures = [{"cause": "refused", "message": "m", "runner": "r-1", "attempt": 1}] * 3
    spent = {"status": "done", "infra_failures": failures}
    traced = Trial(id=1, job_id=1, candidate_id=1, kind="attribute", **spent)
    resolving = Trial(id=2, job_id=1, candidate_id=1, kind="resolve", **spent)
    tried = Trial(id=3, job_id=1, candidate_id=2, kind="run", status="queued",
                  infra_failures=failures[:2])  # fmt: skip
    assert ending_failure([traced, tried]) is None
    assert ending_failure([traced, tried, resolving]) is resolving
