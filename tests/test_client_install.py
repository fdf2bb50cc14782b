"""The thin client: the default install (no extras) submits to, and reads from, a live server.

`uv build --wheel` builds this checkout's wheel; `uvx --from WHEEL bisect-cli ...` installs
it as `uvx --from leakbisect` does for a user: the default dependencies only (pyproject.toml),
fetched from the index uv is configured with through the machine's uv cache (the cold and
warm figures are bench/client_install.py's). The server is `bisect-cli serve` of the
project's full environment on 127.0.0.1 with its own SQLite database, and the fixture
index on loopback lists the releases; every request the client makes goes to loopback.

Checked: a job submitted from that install is created and `status` and `list` show it; the
install holds none of the server's or the runner's packages; the commands it cannot run
(`serve`, `run`, `runner`, `db`, and a read of the local results database) each say in one
line which extra they need, exit 2; `--help` lists every command.
"""

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from uv import find_uv_bin

from runners.client import ApiClient
from service.cli import COMMANDS
from tests.test_cli_service import REPRO, Service, make_env

ROOT = Path(__file__).resolve().parents[1]
# What only the extras install (import names): none may be in the client's environment.
SERVER_AND_RUNNER = {
    "alembic", "docker", "fastapi", "jinja2", "numpy", "psutil", "psycopg", "pydantic_settings",
    "pynvml", "scipy", "sqlalchemy", "sqlmodel", "starlette", "uvicorn",
}  # fmt: skip
CLIENT = {"httpx", "packaging", "pydantic", "rich", "typer", "contract", "runners", "service"}


def build_wheel(out: Path) -> Path:
    """This checkout's wheel, built into `out`."""
    subprocess.run(
        [find_uv_bin(), "build", "--wheel", "--out-dir", str(out), str(ROOT)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    (wheel,) = out.glob("leakbisect-*.whl")
    return wheel


def client_env() -> dict[str, str]:
    """The caller's environment less this project's venv and leakbisect's own settings: the
    uv cache stays the machine's."""
    drop = ("VIRTUAL_ENV", "UV_PROJECT_ENVIRONMENT", "PYTHONPATH")
    return {k: v for k, v in os.environ.items() if k not in drop and not k.startswith("BISECT_")}


class Uvx:
    """`uvx --from WHEEL COMMAND ...`, run in an empty directory (no project around it)."""

    def __init__(self, wheel: Path, work: Path) -> None:
        self.wheel, self.work = wheel, work

    def __call__(
        self, *args: str, env: dict[str, str] | None = None
    ) -> subprocess.CompletedProcess:
        argv = [find_uv_bin(), "tool", "run", "--from", str(self.wheel), *args]
        return subprocess.run(
            argv,
            cwd=self.work,
            env={**client_env(), "COLUMNS": "100", **(env or {})},
            capture_output=True,
            text=True,
            timeout=300,
        )

    def cli(self, *args: str, **env: str) -> subprocess.CompletedProcess:
        return self("bisect-cli", *args, env=env)


@pytest.fixture(scope="module")
def uvx(tmp_path_factory: pytest.TempPathFactory) -> Uvx:
    wheel = build_wheel(tmp_path_factory.mktemp("wheel"))
    return Uvx(wheel, tmp_path_factory.mktemp("client"))


@pytest.fixture(scope="module")
def server(
    tmp_path_factory: pytest.TempPathFactory, reachable_dir, uv_cache: Path
) -> Iterator[Service]:
    """`bisect-cli serve --runners 0` of the full environment: no trial of a job starts."""
    home = tmp_path_factory.mktemp("server")
    svc = Service(home, make_env(home, reachable_dir("client-server-cache"), uv_cache))
    svc.start_serve(f"sqlite:///{home / 'server.db'}")
    try:
        yield svc
    finally:
        svc.stop()


def test_the_client_install_submits_and_reads_a_job(
    uvx: Uvx, server: Service, fixture_index: str
) -> None:
    submitted = uvx.cli(
        "submit", str(REPRO), "--package", "leakyfixture", "--range", "1.0.0..1.0.9",
        "--index-url", fixture_index, "--server", server.url, "--json",
    )  # fmt: skip
    assert submitted.returncode == 0, submitted.stderr
    created = json.loads(submitted.stdout)
    job = created["id"]
    assert created["url"] == f"{server.url}/api/v1/jobs/{job}"
    assert created["status"] == "running"  # its releases listed, its first trials queued
    # The server has it, as the client sent it.
    with ApiClient(server.url, retries=2, backoff=0.2) as api:
        stored = api.get_job(job)
    assert (stored["package"], stored["range"], stored["status"]) == (
        "leakyfixture", "1.0.0..1.0.9", "running",
    )  # fmt: skip
    assert [c["version"] for c in stored["candidates"]] == [f"1.0.{i}" for i in range(10)]

    shown = uvx.cli("status", str(job), "--json", BISECT_SERVER=server.url)
    assert shown.returncode == 0, shown.stderr
    status = json.loads(shown.stdout)
    assert (status["job_id"], status["package"]) == (job, "leakyfixture")
    assert status["status"] == "running"
    assert status["progress"]["candidates"] == 10

    human = uvx.cli("status", str(job), BISECT_SERVER=server.url)
    assert human.returncode == 0, human.stderr
    first = human.stdout.splitlines()[0]
    assert first.startswith(f"job {job} running: 0/10 candidates judged; trials 0 done, 0 running")

    listed = uvx.cli("list", "--json", "--server", server.url)
    assert listed.returncode == 0, listed.stderr
    assert [(i["id"], i["package"]) for i in json.loads(listed.stdout)["items"]] == [
        (job, "leakyfixture")
    ]


def test_the_client_install_holds_no_server_or_runner_package(uvx: Uvx) -> None:
    """The environment uvx made for the wheel: its site-packages, by import name."""
    probe = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    found = uvx("python", "-c", probe)
    assert found.returncode == 0, found.stderr
    site = Path(found.stdout.strip())
    names = {p.name.split("-")[0].split(".")[0].lower() for p in site.iterdir()}
    assert names >= CLIENT, sorted(names)
    assert not names & SERVER_AND_RUNNER, sorted(names & SERVER_AND_RUNNER)


@pytest.mark.parametrize(
    ("args", "extra", "missing"),
    [
        (["serve"], "server", "uvicorn"),
        (["run", "--help"], "server", "sqlalchemy"),
        (["db", "upgrade"], "server", "sqlalchemy"),
        (["runner"], "runner", "psutil"),
    ],
)
def test_the_client_install_names_the_extra_a_command_needs(
    uvx: Uvx, args: list[str], extra: str, missing: str
) -> None:
    proc = uvx.cli(*args)
    assert proc.returncode == 2
    assert proc.stderr == (
        f"error: bisect-cli {args[0]} needs the {extra} extra (no {missing} here): "
        f"uv tool install 'leakbisect[{extra}]'\n"
    )
    assert proc.stdout == ""


def test_the_client_install_names_the_extra_a_local_read_needs(uvx: Uvx) -> None:
    """Without --server or BISECT_SERVER, status reads the local results database."""
    proc = uvx.cli("status", "1")
    assert proc.returncode == 2
    assert proc.stderr == (
        "error: the local results database (read without --server or BISECT_SERVER) needs "
        "the server extra (no sqlalchemy here): uv tool install 'leakbisect[server]'\n"
    )


def test_the_client_install_lists_every_command(uvx: Uvx) -> None:
    proc = uvx.cli("--help")
    assert proc.returncode == 0, proc.stderr
    listed = [line.split()[1] for line in proc.stdout.splitlines() if line.startswith("│ ")]
    assert set(COMMANDS) <= set(listed), listed


def test_a_missing_module_of_our_own_is_a_bug_not_an_extra() -> None:
    from service.cli.errors import needs_extra

    missing = ModuleNotFoundError("No module named 'service.gone'", name="service.gone")
    with pytest.raises(ModuleNotFoundError) as raised:
        needs_extra("bisect-cli serve", missing)
    assert raised.value is missing
