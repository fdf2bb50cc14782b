"""The CI step end to end: action.yml's step and the GitLab template's script, run with bash
as each CI would, against a live `bisect-cli serve` on loopback.

Real: the server (`serve` and two `runner` processes, tests/test_cli_service.py's `Service`)
with one API token, the bisection of the offline example (one per module: leakyfixture
1.0.0..1.0.9, first leaking release 1.0.6; the other runs follow that job with --job), uv
installing the client from a copy of this checkout as GitHub downloads an action (offline,
from the uv cache: a test's traffic stays on loopback), bash running the steps, git cloning
leakbisect for the GitLab job.

Stand-ins, named so in the tests, for what cannot run or be reached here:
- the Actions runner and the GitLab runner: `render` substitutes the `${{ ... }}`
  expressions of action.yml as GitHub's runner does, `run_gitlab` expands the template's
  variables and mints its `id_tokens:`; both then run the scripts with bash;
- the forge (`StandIn`): GitHub's OIDC token endpoint, GitHub's issue-comment API and
  GitLab's merge request notes API, on 127.0.0.1, keeping the comments and every request.

The server's only API token is the JWT the stand-in token endpoint issues for AUDIENCE: a
submission it accepts is one that sent that token as its bearer.
"""

import base64
import json
import os
import re
import shutil
import subprocess
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
import yaml
from typer.testing import CliRunner

from runners.client import ApiClient
from service.cli import app
from service.cli.ci import comment_text, output_lines, outputs_of
from service.cli.forge import Forge, marker
from service.schemas import Report
from tests.test_cli_service import REPRO, Service, make_env

REPO = Path(__file__).resolve().parents[1]
AUDIENCE = "leakbisect-test"
RUNNER_TOKEN = "runner-secret-for-the-ci-tests"
ID_REQUEST_TOKEN = "actions-id-request-secret"
GH_TOKEN, GL_TOKEN = "gh-stand-in-token", "gl-stand-in-token"
SHA = "0123456789abcdef0123456789abcdef01234567"


def fake_jwt(audience: str) -> str:
    """A JWT-shaped identity token (the server here compares it as a token; verifying one is
    the OIDC server side's, tested there)."""

    def part(value: dict[str, Any]) -> str:
        return base64.urlsafe_b64encode(json.dumps(value).encode()).rstrip(b"=").decode()

    claims = {"iss": "stand-in", "aud": audience, "sub": "repo:acme/widgets:pull_request"}
    return f"{part({'alg': 'RS256', 'typ': 'JWT'})}.{part(claims)}.c3RhbmQtaW4"


# ------------------------------------------------------------------- the stand-in forge


@dataclass
class StandIn:
    """GitHub's OIDC token endpoint (/oidc/token), GitHub's issue comments (/gh/...) and
    GitLab's merge request notes (/gl/api/v4/...): the few endpoints the CI step calls.
    Repository acme/locked refuses everything with 403, as GitHub does a read-only token."""

    url: str = ""
    threads: dict[tuple[str, str, str], list[dict[str, Any]]] = field(default_factory=dict)
    requests: list["Request"] = field(default_factory=list)
    next_id: int = 1000

    def thread(self, forge: str, project: str, number: str) -> list[dict[str, Any]]:
        return self.threads.setdefault((forge, project, number), [])

    def add(self, thread: list[dict[str, Any]], body: str) -> dict[str, Any]:
        self.next_id += 1
        comment = {"id": self.next_id, "body": body, "edits": 0}
        thread.append(comment)
        return comment

    def calls(self, prefix: str) -> list[tuple[str, str]]:
        return [(r.method, r.path) for r in self.requests if r.path.startswith(prefix)]


GH_LIST = re.compile(r"/gh/repos/(?P<p>[^/]+/[^/]+)/issues/(?P<n>\d+)/comments")
GH_ITEM = re.compile(r"/gh/repos/(?P<p>[^/]+/[^/]+)/issues/comments/(?P<id>\d+)")
GL_LIST = re.compile(r"/gl/api/v4/projects/(?P<p>[^/]+)/merge_requests/(?P<n>\d+)/notes")
GL_ITEM = re.compile(
    r"/gl/api/v4/projects/(?P<p>[^/]+)/merge_requests/(?P<n>\d+)/notes/(?P<id>\d+)"
)
# forge -> (its list-and-post path, its edit path, its edit method, the auth header it checks)
FORGES = {
    "github": (GH_LIST, GH_ITEM, "PATCH", ("Authorization", f"Bearer {GH_TOKEN}")),
    "gitlab": (GL_LIST, GL_ITEM, "PUT", ("PRIVATE-TOKEN", GL_TOKEN)),
}


@dataclass
class Request:
    method: str
    path: str
    query: dict[str, str]
    headers: Any
    body: Any


def route(state: StandIn, request: Request) -> tuple[int, Any]:
    """The stand-in's answer: (HTTP status, JSON)."""
    if request.path == "/oidc/token":
        if request.headers.get("Authorization") != f"bearer {ID_REQUEST_TOKEN}":
            return 401, {"message": "bad request token"}
        return 200, {"value": fake_jwt(request.query["audience"])}
    forge = {"/gh/": "github", "/gl/": "gitlab"}.get(request.path[:4])
    if forge is None:
        return 404, {"message": "Not Found"}
    header, expected = FORGES[forge][3]
    if request.headers.get(header) != expected:
        return 401, {"message": "Bad credentials"}
    if "/acme/locked/" in request.path:
        return 403, {"message": "Resource not accessible by integration"}
    return comments(state, forge, request)


def comments(state: StandIn, forge: str, request: Request) -> tuple[int, Any]:
    """List (paged) and post at the thread's path, edit at a comment's."""
    listing, item, edit, _ = FORGES[forge]
    if (m := listing.fullmatch(request.path)) is not None:
        thread = state.thread(forge, m["p"], m["n"])
        if request.method == "POST":
            return 201, state.add(thread, request.body["body"])
        per_page, page = int(request.query.get("per_page", 30)), int(request.query.get("page", 1))
        return 200, thread[(page - 1) * per_page : page * per_page]
    if (m := item.fullmatch(request.path)) is not None and request.method == edit:
        for (where, project, _), thread in state.threads.items():
            for comment in thread:
                if (where, project, comment["id"]) == (forge, m["p"], int(m["id"])):
                    comment["body"], comment["edits"] = request.body["body"], comment["edits"] + 1
                    return 200, comment
    return 404, {"message": "Not Found"}


def handler_for(state: StandIn) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:  # quiet
            pass

        def handle_any(self) -> None:
            split = urlsplit(self.path)
            length = int(self.headers.get("Content-Length") or 0)
            request = Request(
                self.command,
                split.path,
                {k: v[0] for k, v in parse_qs(split.query).items()},
                self.headers,
                json.loads(self.rfile.read(length)) if length else None,
            )
            state.requests.append(request)
            code, value = route(state, request)
            data = json.dumps(value).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = do_PATCH = do_PUT = handle_any

    return Handler


@pytest.fixture(scope="module")
def standin() -> Iterator[StandIn]:
    state = StandIn()
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler_for(state))
    state.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield state
    finally:
        server.shutdown()
        server.server_close()


# -------------------------------------------------------------------- the live service


@pytest.fixture(scope="module")
def service(
    tmp_path_factory: pytest.TempPathFactory, reachable_dir: Any, uv_cache: Path
) -> Iterator[Service]:
    home = tmp_path_factory.mktemp("ci-service")
    svc = Service(home, make_env(home, reachable_dir("ci-service-cache"), uv_cache))
    svc.start_serve(
        f"sqlite:///{home / 'service.db'}",
        BISECT_API_TOKENS=f"ci:{fake_jwt(AUDIENCE)}",
        BISECT_RUNNER_TOKENS=f"runners:{RUNNER_TOKEN}",
        BISECT_ALLOWED_INDEXES="127.0.0.1",  # with tokens, a loopback index must be listed
    )
    svc.start_runner("runner-a", BISECT_RUNNER_TOKEN=RUNNER_TOKEN)
    svc.start_runner("runner-b", BISECT_RUNNER_TOKEN=RUNNER_TOKEN)
    try:
        yield svc
    finally:
        svc.stop()


@pytest.fixture(scope="module")
def checkout(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """This checkout's files (committed or not, less what git ignores) in a folder of their
    own, as GitHub downloads an action, and as a git repository the GitLab job clones."""
    target = tmp_path_factory.mktemp("actions") / "leakbisect"
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO, capture_output=True, check=True,
    ).stdout.decode().split("\0")  # fmt: skip
    for name in filter(None, listed):
        source = REPO / name
        if source.is_file():
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target / name)
    git = ["git", "-c", "user.name=ci", "-c", "user.email=ci@localhost"]
    subprocess.run(git + ["init", "-q", "-b", "main"], cwd=target, check=True)
    subprocess.run(git + ["add", "-A"], cwd=target, check=True)
    subprocess.run(git + ["commit", "-q", "-m", "leakbisect"], cwd=target, check=True)
    return target


def ci_env(**extra: str) -> dict[str, str]:
    """The CI machine's environment: this one's, less any CI's or leakbisect's own, uv
    offline (it installs from the cache)."""
    drop = ("BISECT_", "GITHUB_", "GITLAB_", "CI_", "ACTIONS_", "RUNNER_", "UV_PROJECT_ENV")
    env = {k: v for k, v in os.environ.items() if not k.startswith(drop) and k != "VIRTUAL_ENV"}
    return {**env, "UV_OFFLINE": "1", **extra}


# ---------------------------------------------- a stand-in for the GitHub Actions runner


EXPRESSION = re.compile(r"\$\{\{\s*(.*?)\s*\}\}")
ACTION = yaml.safe_load((REPO / "action.yml").read_text())


def render(text: str, context: dict[str, str]) -> str:
    """`text` with each `${{ name }}` replaced as the Actions runner does for the names this
    action uses (the runner cannot run here; an expression it does not know fails)."""

    def value(match: re.Match[str]) -> str:
        assert match[1] in context, f"the stand-in runner does not know {match[1]}"
        return context[match[1]]

    return EXPRESSION.sub(value, text)


def read_github_output(text: str) -> dict[str, str]:
    """GitHub's $GITHUB_OUTPUT: ``name=value`` lines and ``name<<DELIMITER`` heredocs."""
    values: dict[str, str] = {}
    lines = iter(text.splitlines())
    for line in lines:
        name, heredoc, delimiter = line.partition("<<")
        if heredoc and "=" not in name:
            body = []
            for inner in lines:
                if inner == delimiter:
                    break
                body.append(inner)
            values[name] = "\n".join(body)
        else:
            key, _, value = line.partition("=")
            values[key] = value
    return values


@dataclass
class Run:
    returncode: int
    stdout: str
    stderr: str
    summary: str = ""
    outputs: dict[str, str] = field(default_factory=dict)


def github_env(work: Path, standin: StandIn, repo: str, event: dict[str, Any]) -> dict[str, str]:
    (work / "event.json").write_text(json.dumps(event))
    for name in ("summary.md", "output", "env", "path"):
        (work / name).write_text("")
    return {
        "CI": "true",
        "GITHUB_ACTIONS": "true",
        "GITHUB_WORKSPACE": str(work / "workspace"),
        "GITHUB_STEP_SUMMARY": str(work / "summary.md"),
        "GITHUB_OUTPUT": str(work / "output"),
        "GITHUB_ENV": str(work / "env"),
        "GITHUB_PATH": str(work / "path"),
        "GITHUB_EVENT_NAME": "pull_request",
        "GITHUB_EVENT_PATH": str(work / "event.json"),
        "GITHUB_REPOSITORY": repo,
        "GITHUB_API_URL": f"{standin.url}/gh",
        "GITHUB_SHA": SHA,
        "RUNNER_TEMP": str(work),
        "ACTIONS_ID_TOKEN_REQUEST_URL": f"{standin.url}/oidc/token?api-version=2.0",
        "ACTIONS_ID_TOKEN_REQUEST_TOKEN": ID_REQUEST_TOKEN,
    }


def run_action(
    checkout: Path,
    work: Path,
    standin: StandIn,
    inputs: dict[str, str],
    repo: str = "acme/widgets",
    event: dict[str, Any] | None = None,
) -> Run:
    """Run action.yml's steps as GitHub does: inputs and their defaults rendered into each
    step's env and script, the script run by `bash --noprofile --norc -eo pipefail FILE` in
    the workspace, $GITHUB_OUTPUT read into the step's outputs, and the action's outputs
    rendered from them."""
    assert set(inputs) <= set(ACTION["inputs"]), "an input action.yml does not declare"
    (work / "workspace").mkdir(parents=True, exist_ok=True)
    env = ci_env(**github_env(work, standin, repo, event or {"pull_request": {"number": 7}}))
    context = {"github.action_path": str(checkout), "github.token": GH_TOKEN}
    for name, spec in ACTION["inputs"].items():
        context[f"inputs.{name}"] = inputs.get(name, render(str(spec.get("default", "")), context))
    assert ACTION["runs"]["using"] == "composite"
    proc: subprocess.CompletedProcess[str] | None = None
    for number, step in enumerate(ACTION["runs"]["steps"]):
        assert step["shell"] == "bash"
        script = work / f"step{number}.sh"
        script.write_text(render(step["run"], context))
        step_env = {k: render(str(v), context) for k, v in step.get("env", {}).items()}
        proc = subprocess.run(
            ["bash", "--noprofile", "--norc", "-eo", "pipefail", str(script)],
            cwd=work / "workspace", env={**env, **step_env},
            capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        produced = read_github_output((work / "output").read_text())
        context.update({f"steps.{step['id']}.outputs.{k}": v for k, v in produced.items()})
        if proc.returncode != 0:
            break
    assert proc is not None
    outputs = {
        name: EXPRESSION.sub(lambda m: context.get(m[1], ""), spec["value"])
        for name, spec in ACTION["outputs"].items()
    }
    summary = (work / "summary.md").read_text()
    return Run(proc.returncode, proc.stdout, proc.stderr, summary, outputs)


# ------------------------------------------------ the one real bisection of this module


@pytest.fixture(scope="module")
def first_run(
    service: Service,
    standin: StandIn,
    checkout: Path,
    fixture_index: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> Run:
    """The action on a pull request: submit the example with OIDC, wait, summary, outputs,
    a comment keyed "memory", and exit 7 for found as chosen."""
    work = tmp_path_factory.mktemp("gh-first")
    (work / "workspace").mkdir()
    shutil.copy(REPRO, work / "workspace" / "repro.py")
    standin.thread("github", "acme/widgets", "7").extend(
        [
            {"id": 1, "body": "LGTM", "edits": 0},
            {"id": 2, "body": "quoting <!-- leakbisect: memory --> is not ours", "edits": 0},
        ]
    )
    run = run_action(
        checkout, work, standin,
        {
            "server": service.url, "script": "repro.py", "package": "leakyfixture",
            "range": "1.0.0..1.0.9", "args": f"--index-url '{fixture_index}' --no-reuse",
            "oidc-audience": AUDIENCE, "comment": "true", "comment-key": "memory",
            "exit-on": "found=7",
        },
    )  # fmt: skip
    assert run.returncode == 7, run.stderr + "".join(p.read_text() for p in service.logs)
    if target := os.environ.get("CI_SUMMARY_DIR"):  # CI_SUMMARY_DIR=docs refreshes the docs'
        Path(target).mkdir(parents=True, exist_ok=True)
        Path(target, "ci-job-summary.md").write_text(run.summary)
    return run


def markdown_of(service: Service, job_id: str) -> str:
    with ApiClient(service.url, fake_jwt(AUDIENCE), retries=1) as client:
        return client.request("GET", f"/jobs/{job_id}/report.md").text


def test_action_step_writes_summary_outputs_and_the_chosen_exit_status(
    service: Service, first_run: Run
) -> None:
    job = first_run.outputs["job-id"]
    assert first_run.outputs == {
        "status": "found",
        "first-bad": "1.0.6",
        "last-good": "1.0.5",
        "first-good": "",
        "last-bad": "",
        "job-id": job,
        "job-url": f"{service.url}/jobs/{job}",
    }
    # The job summary is the server's Markdown report, whole; its headline names 1.0.6.
    markdown = markdown_of(service, job)
    assert first_run.summary == markdown
    assert "first bad 1.0.6, last good 1.0.5" in markdown
    assert "first bad is 1.0.6" in " ".join(first_run.stdout.split())  # the text report
    assert f"job {job}: {service.url}/jobs/{job}\n" in first_run.stderr


def test_oidc_token_is_fetched_from_a_stand_in_github_endpoint_and_sent_as_the_bearer(
    standin: StandIn, first_run: Run
) -> None:
    """The server's only API token is the stand-in's JWT for AUDIENCE: the job exists, so
    the step sent it; the stand-in saw the request GitHub's runner documents."""
    asked = [r for r in standin.requests if r.path == "/oidc/token"]
    assert asked[0].query == {"api-version": "2.0", "audience": AUDIENCE}
    assert asked[0].headers["Authorization"] == f"bearer {ID_REQUEST_TOKEN}"
    assert first_run.outputs["status"] == "found"


def test_a_token_the_server_does_not_know_is_refused_in_one_line(
    service: Service, standin: StandIn, first_run: Run
) -> None:
    """The identity token fetched is the one sent: for another audience the stand-in
    issues another token, and the server refuses it (401, exit 2)."""
    result = CliRunner().invoke(
        app,
        ["ci", "--job", first_run.outputs["job-id"], "--server", service.url,
         "--oidc-audience", "someone-else"],
        env={**github_env_only(standin), "BISECT_TOKEN": ""},
    )  # fmt: skip
    assert result.exit_code == 2
    assert result.stderr == "error: HTTP 401: invalid bearer token\n"
    asked = [r for r in standin.requests if r.path == "/oidc/token"]
    assert asked[-1].query["audience"] == "someone-else"


def github_env_only(standin: StandIn) -> dict[str, str]:
    return {
        "GITHUB_ACTIONS": "true",
        "ACTIONS_ID_TOKEN_REQUEST_URL": f"{standin.url}/oidc/token?api-version=2.0",
        "ACTIONS_ID_TOKEN_REQUEST_TOKEN": ID_REQUEST_TOKEN,
        "GITHUB_STEP_SUMMARY": "",
        "GITHUB_OUTPUT": "",
    }


def test_pr_comment_edited_in_place_against_a_stand_in_github(
    service: Service,
    standin: StandIn,
    checkout: Path,
    first_run: Run,
    tmp_path: Path,
) -> None:
    thread = standin.thread("github", "acme/widgets", "7")
    job = first_run.outputs["job-id"]
    footer = f"\n\n<sub>leakbisect (memory) for commit {SHA[:12]}</sub>\n"
    mine = [c for c in thread if c["body"].startswith("<!-- leakbisect: memory -->\n")]
    assert len(mine) == 1 and mine[0]["edits"] == 0
    assert mine[0]["body"] == f"<!-- leakbisect: memory -->\n{first_run.summary}{footer}"
    assert f"comment {mine[0]['id']} posted (memory)" in first_run.stderr
    # A re-run with the same key edits that comment; the others are left alone.
    again = run_action(
        checkout, tmp_path / "again", standin,
        {"server": service.url, "job": job, "oidc-audience": AUDIENCE, "comment": "true",
         "comment-key": "memory"},
    )  # fmt: skip
    assert again.returncode == 0, again.stderr  # found: 0 by default
    assert f"comment {mine[0]['id']} edited (memory)" in again.stderr
    assert [c["edits"] for c in thread] == [0, 0, 1]
    assert standin.calls(f"/gh/repos/acme/widgets/issues/comments/{mine[0]['id']}") == [
        ("PATCH", f"/gh/repos/acme/widgets/issues/comments/{mine[0]['id']}")
    ]
    # Another key is another bisection: a second comment of ours (here from a push, whose
    # event has no pull request: the pr input names it).
    other = run_action(
        checkout, tmp_path / "other", standin,
        {"server": service.url, "job": job, "oidc-audience": AUDIENCE, "comment": "true",
         "comment-key": "numpy-2", "pr": "7"},
        event={"ref": "refs/heads/main"},
    )  # fmt: skip
    assert other.returncode == 0, other.stderr
    ours = [c["body"].split("\n", 1)[0] for c in thread if c["body"].startswith("<!-- leak")]
    assert ours == ["<!-- leakbisect: memory -->", "<!-- leakbisect: numpy-2 -->"]
    sent = {r.headers["Authorization"] for r in standin.requests if r.path.startswith("/gh/")}
    assert sent == {f"Bearer {GH_TOKEN}"}


@pytest.mark.parametrize(
    ("repo", "event", "warning"),
    [
        ("acme/locked", {"pull_request": {"number": 7}},
         "listing comments: HTTP 403: Resource not accessible by integration"),
        ("acme/widgets", {"ref": "refs/heads/main"},
         "this run has no pull request (give --pr N)"),
    ],
)  # fmt: skip
def test_a_comment_a_stand_in_github_refuses_is_one_warning_and_the_result_stands(
    service: Service,
    standin: StandIn,
    checkout: Path,
    first_run: Run,
    tmp_path: Path,
    repo: str,
    event: dict[str, Any],
    warning: str,
) -> None:
    run = run_action(
        checkout, tmp_path, standin,
        {"server": service.url, "job": first_run.outputs["job-id"], "token": fake_jwt(AUDIENCE),
         "comment": "true", "exit-on": "found=1"},
        repo=repo, event=event,
    )  # fmt: skip
    assert run.returncode == 1  # found=1, as chosen: the comment changes nothing
    warnings = [line for line in run.stderr.splitlines() if line.startswith("warning:")]
    assert warnings == [f"warning: comment not posted: {warning}; the result stands"]
    assert run.outputs["first-bad"] == "1.0.6"
    assert run.summary == first_run.summary


# ------------------------------------------------ a stand-in for the GitLab runner


TEMPLATE = yaml.safe_load((REPO / "ci" / "gitlab" / "leakbisect.yml").read_text())
VARIABLE = re.compile(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?")


def run_gitlab(
    checkout: Path, project: Path, standin: StandIn, variables: dict[str, str]
) -> tuple[subprocess.CompletedProcess[str], dict[str, str]]:
    """A job that `extends: .leakbisect` with `variables`, run as GitLab's runner does: the
    predefined variables, the job's variables expanded over them, an identity token minted
    for each `id_tokens:` entry (by the stand-in, for its `aud`), the script's lines run by
    bash with errexit in the project folder. Its environment is returned with it."""
    job = TEMPLATE[".leakbisect"]
    project.mkdir(parents=True)
    env = ci_env(
        CI="true", GITLAB_CI="true", CI_PROJECT_DIR=str(project), CI_PROJECT_ID="42",
        CI_MERGE_REQUEST_IID="3", CI_API_V4_URL=f"{standin.url}/gl/api/v4",
        CI_COMMIT_SHA=SHA, GITLAB_TOKEN=GL_TOKEN,
    )  # fmt: skip
    for name, value in {**job["variables"], **variables}.items():
        env[name] = VARIABLE.sub(lambda m: env.get(m[1], ""), str(value))
    for name, spec in job["id_tokens"].items():
        env[name] = fake_jwt(VARIABLE.sub(lambda m: env.get(m[1], ""), spec["aud"]))
    script = project.parent / f"{project.name}.sh"
    script.write_text("\n".join(job["script"]) + "\n")
    proc = subprocess.run(
        ["bash", "--noprofile", "--norc", "-eo", "pipefail", str(script)],
        cwd=project, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    return proc, env


def test_gitlab_template_against_a_stand_in_gitlab(
    service: Service, standin: StandIn, checkout: Path, first_run: Run, tmp_path: Path
) -> None:
    job = first_run.outputs["job-id"]
    notes = standin.thread("gitlab", "42", "3")
    # Someone else's notes first: ours is on the second page of 100.
    for n in range(120):
        notes.append({"id": n + 1, "body": f"note {n}", "edits": 0})
    variables = {
        "BISECT_SERVER": service.url,
        "BISECT_OIDC_AUDIENCE": AUDIENCE,
        "LEAKBISECT_JOB": job,
        "LEAKBISECT_COMMENT": "true",
        "LEAKBISECT_REPO": str(checkout),
    }
    for attempt in ("first", "again"):
        proc, env = run_gitlab(checkout, tmp_path / attempt, standin, variables)
        assert proc.returncode == 0, proc.stderr  # found: 0, run's status
        project = tmp_path / attempt
        # leakbisect was cloned into the project's .leakbisect (the template's default).
        assert env["LEAKBISECT_DIR"] == f"{project}/.leakbisect"
        assert (project / ".leakbisect" / "ci" / "step.sh").is_file()
        assert (project / "leakbisect.env").read_text() == (
            f"LEAKBISECT_STATUS=found\nLEAKBISECT_FIRST_BAD=1.0.6\nLEAKBISECT_LAST_GOOD=1.0.5\n"
            f"LEAKBISECT_JOB_ID={job}\nLEAKBISECT_JOB_URL={service.url}/jobs/{job}\n"
        )
        assert (project / "leakbisect-report.md").read_text() == first_run.summary
    ours = [n for n in notes if n["body"].startswith("<!-- leakbisect: leakyfixture -->\n")]
    assert len(ours) == 1 and ours[0]["edits"] == 1 and len(notes) == 121
    base = "/gl/api/v4/projects/42/merge_requests/3/notes"
    writes = [c for c in standin.calls(base) if c[0] != "GET"]
    assert writes == [("POST", base), ("PUT", f"{base}/{ours[0]['id']}")]
    assert {r.headers["PRIVATE-TOKEN"] for r in standin.requests if r.path.startswith(base)} == {
        GL_TOKEN
    }


def test_gitlab_template_declares_its_id_token_and_dotenv_report() -> None:
    job = TEMPLATE[".leakbisect"]
    assert job["id_tokens"] == {"BISECT_ID_TOKEN": {"aud": "$BISECT_OIDC_AUDIENCE"}}
    assert job["artifacts"]["reports"] == {"dotenv": "leakbisect.env"}
    assert job["artifacts"]["paths"] == ["leakbisect-report.md"]


# ------------------------------------------------------------------ bad input, no server


def refused(standin: StandIn, *args: str, **env: str) -> str:
    """stderr of `bisect-cli ci ARGS`, which must exit 2 before any request."""
    before = len(standin.requests)
    base = {"GITHUB_STEP_SUMMARY": "", "GITHUB_OUTPUT": "", "GITHUB_ACTIONS": "", "GITLAB_CI": ""}
    result = CliRunner().invoke(
        app, ["ci", "--server", standin.url, *args], env={**base, "BISECT_TOKEN": "", **env}
    )
    assert result.exit_code == 2, result.output
    assert len(standin.requests) == before
    return result.stderr


def test_bad_ci_input_is_one_line_before_anything_is_sent(standin: StandIn, tmp_path: Path) -> None:
    script = str(REPRO)
    assert refused(standin, "--job", "1", "--exit-on", "leaked=1") == (
        "error: --exit-on: 'leaked' is not an outcome; allowed: found, bounds_failed, "
        "inconclusive, error, cancelled\n"
    )
    assert refused(standin, "--job", "1", "--exit-on", "found=1,inconclusive=x") == (
        "error: --exit-on: 'inconclusive=x': the status must be a whole number 0 to 255\n"
    )
    assert refused(standin, "--job", "1", "--comment-key", "a-->b") == (
        "error: --comment-key: 'a-->b' is not a key: letters, digits and . _ : / @ + -, "
        "up to 100 characters\n"
    )
    missing = tmp_path / "no-such-dir" / "out"
    assert refused(standin, "--job", "1", "--outputs", str(missing)) == (
        f"error: --outputs: cannot write {missing}: No such file or directory\n"
    )
    assert refused(standin, "--job", "1", script) == (
        "error: --job: follows a job submitted earlier; drop SCRIPT\n"
    )
    assert refused(standin, "--package", "leakyfixture") == (
        "error: SCRIPT: missing; give the repro script to run, or --job ID\n"
    )


def test_oidc_without_what_the_ci_must_give_is_one_line(standin: StandIn) -> None:
    aud = ("--job", "1", "--oidc-audience", AUDIENCE)
    assert refused(standin, *aud, "--forge", "github") == (
        "error: --oidc-audience: ACTIONS_ID_TOKEN_REQUEST_URL is not set: the workflow needs "
        "`permissions: id-token: write`\n"
    )
    assert refused(standin, *aud, GITLAB_CI="true") == (
        f"error: --oidc-audience: BISECT_ID_TOKEN is not set: give the job `id_tokens: "
        f"BISECT_ID_TOKEN: aud: {AUDIENCE}`\n"
    )
    assert refused(standin, *aud, "--oidc-token-env", "LB_ID", GITLAB_CI="true") == (
        f"error: --oidc-audience: LB_ID is not set: give the job `id_tokens: "
        f"LB_ID: aud: {AUDIENCE}`\n"
    )
    assert refused(standin, *aud, GITLAB_CI="true", BISECT_ID_TOKEN=fake_jwt("other")) == (
        f"error: --oidc-audience: BISECT_ID_TOKEN is not a token for the audience "
        f"'{AUDIENCE}': set its id_tokens aud to the same audience\n"
    )
    assert refused(standin, *aud, "--forge", "none") == (
        "error: --oidc-audience: an identity token comes from GitHub Actions or GitLab CI "
        "(give --forge)\n"
    )


def test_outputs_in_githubs_form_and_as_dotenv() -> None:
    values = {"status": "found", "first-bad": "1.0.6", "last-good": "", "note": "two\nlines"}
    github = output_lines(values, Forge.GITHUB)
    lines = github.splitlines()
    assert lines[:2] == ["status=found", "first-bad=1.0.6"]
    assert lines[2].startswith("note<<ghadelimiter_") and lines[3:] == [
        "two",
        "lines",
        lines[2][6:],
    ]
    assert read_github_output(github) == {
        "status": "found",
        "first-bad": "1.0.6",
        "note": "two\nlines",
    }
    assert output_lines(values, Forge.GITLAB) == (
        "LEAKBISECT_STATUS=found\nLEAKBISECT_FIRST_BAD=1.0.6\nLEAKBISECT_NOTE=two lines\n"
    )


def test_a_report_too_long_for_a_comment_is_cut_at_a_line_with_a_link(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("GITHUB_SHA", SHA)
    markdown = "".join(f"| 1.0.{n} | clean |\n" for n in range(5000))  # 93,890 characters
    page = "http://127.0.0.1:8000/jobs/3"
    text = comment_text(markdown, "numpy", page)
    kept, cut = text.split("\n\n_Cut", 1)
    assert markdown.startswith(kept + "\n") and kept.endswith("| clean |")
    assert cut == (
        f" to fit a comment: the whole report is on [its page]({page})._\n"
        f"\n\n<sub>leakbisect (numpy) for commit {SHA[:12]}</sub>\n"
    )
    assert len(marker("numpy")) + 1 + len(text) <= 65_536
    assert comment_text("short\n", "numpy", page) == (
        f"short\n\n\n<sub>leakbisect (numpy) for commit {SHA[:12]}</sub>\n"
    )


@pytest.mark.parametrize(("find_fix", "names"), [(False, ("first-bad", "last-good")),
                                                 (True, ("first-good", "last-bad"))])  # fmt: skip
def test_outputs_name_the_pair_as_the_job_asked(find_fix: bool, names: tuple[str, str]) -> None:
    report = Report(
        job_id=3, status="found", package="p", range="1.0..1.2", find_fix=find_fix,
        last_old="1.0", first_new="1.1",
    )  # fmt: skip
    assert outputs_of(report, 3, "http://127.0.0.1:8000/jobs/3") == {
        "status": "found",
        names[0]: "1.1",
        names[1]: "1.0",
        "job-id": "3",
        "job-url": "http://127.0.0.1:8000/jobs/3",
    }
