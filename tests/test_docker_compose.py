"""compose.yaml: its configuration is accepted, and the stack it describes answers a job.

``docker-compose config`` (Debian's docker-compose; ``docker compose config`` too where the
plugin exists: not with Debian's docker.io) must accept compose.yaml alone and with
compose.local.yaml. The stack
test brings up ``api`` and ``runner`` for real with compose.local.yaml (images from the
debootstrapped base, the host's Postgres at 127.0.0.1:5432 in a fresh database) and
submits the bundled example with ``--wait``: the right release, and no network created.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.docker_util import API_IMAGE, RUNNER_IMAGE, engine, unavailable
from tests.test_cli_service import REPRO, free_port, wait_until

pytestmark = pytest.mark.docker
ROOT = Path(__file__).resolve().parents[1]
FILES = ["-f", str(ROOT / "compose.yaml")]
LOCAL = [*FILES, "-f", str(ROOT / "compose.local.yaml")]


def compose_cli() -> list[str]:
    found = shutil.which("docker-compose")
    if found is None:
        unavailable("docker-compose is not installed (apt-get install docker-compose)")
    return [found]  # type: ignore[list-item]


def env_file(tmp_path: Path, **values: str) -> Path:
    text = (ROOT / ".env.example").read_text()
    lines = [ln for ln in text.splitlines() if ln and not ln.startswith("#")]
    data = dict(ln.split("=", 1) for ln in lines)
    data.update(values)
    path = tmp_path / "env"
    path.write_text("".join(f"{k}={v}\n" for k, v in data.items()))
    return path


def runner_names(project: list[str]) -> list[str]:
    """The names the runner service registered under, from its log, oldest first."""
    logs = run([*compose_cli(), *project, "logs", "--no-color", "runner"]).stdout
    return re.findall(r"registered as \S+ \((compose-[0-9a-f]+)\)", logs)


def run(args: list[str], timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, capture_output=True, text=True, timeout=timeout, cwd=ROOT)


@pytest.mark.parametrize("files", [FILES, LOCAL], ids=["compose.yaml", "with-local"])
def test_docker_compose_config_accepts_compose_yaml(tmp_path: Path, files: list[str]) -> None:
    env = env_file(tmp_path)
    proc = run([*compose_cli(), "--env-file", str(env), *files, "config"])
    assert proc.returncode == 0, proc.stderr
    services = proc.stdout.split("services:", 1)[1]
    for name in ("api:", "postgres:", "runner:", "runner-gpu:"):
        assert f"\n  {name}" in services
    assert "network_mode: host" in proc.stdout
    assert "BISECT_DATABASE_URL" not in proc.stdout.split("  runner:", 1)[1].split("\n  ")[0]
    # The compose plugin too, where this machine has it (Debian's docker.io does not).
    docker = shutil.which("docker")
    if docker is not None and run([docker, "compose", "version"]).returncode == 0:
        plugin = run([docker, "compose", "--env-file", str(env), *files, "config"])
        assert plugin.returncode == 0, plugin.stderr


@pytest.fixture
def database() -> Iterator[str]:
    import psycopg

    name = f"leakbisect_compose_{os.getpid()}"
    try:
        admin = psycopg.connect("postgresql://postgres@127.0.0.1:5432/test", autocommit=True)
    except psycopg.OperationalError as exc:
        unavailable(f"no Postgres at 127.0.0.1:5432: {exc}")
    admin.execute(f"DROP DATABASE IF EXISTS {name}")
    admin.execute(f"CREATE DATABASE {name}")
    yield f"postgresql+psycopg://postgres@127.0.0.1:5432/{name}"
    admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
    admin.close()


def test_the_compose_stack_answers_submit_wait(
    tmp_path: Path, database: str, fixture_index: str
) -> None:
    client: Any = engine(RUNNER_IMAGE, API_IMAGE)
    port = free_port()
    env = env_file(tmp_path, BISECT_DATABASE_URL=database, BISECT_PORT=str(port),
                   BISECT_ALLOWED_INDEXES="127.0.0.1", BASE_IMAGE="leakbisect-base:bookworm",
                   BISECT_API_TOKENS="client-tok", BISECT_RUNNER_TOKENS="runner-tok",
                   BISECT_RUNNER_TOKEN="runner-tok")  # fmt: skip
    project = ["-p", f"lbtest{os.getpid()}", "--env-file", str(env), *LOCAL]
    networks = {n.id for n in client.networks.list()}
    up = run([*compose_cli(), *project, "up", "-d", "--no-build", "api", "runner"], 300)
    try:
        assert up.returncode == 0, up.stderr
        submit = subprocess.run(
            [sys.executable, "-m", "service.cli", "submit", str(REPRO), "-p", "leakyfixture",
             "--range", "1.0.0..1.0.9", "--index-url", fixture_index, "--wait", "--json",
             "--server", f"http://127.0.0.1:{port}"],
            capture_output=True, text=True, timeout=600,
            env={**os.environ, "BISECT_TOKEN": "client-tok"},  # never a token on argv
        )  # fmt: skip
        logs = run([*compose_cli(), *project, "logs", "--no-color"]).stdout[-3000:]
        assert submit.returncode == 0, submit.stderr + logs
        report = json.loads(submit.stdout)
        assert (report["last_good"], report["first_bad"]) == ("1.0.5", "1.0.6")
        assert {n.id for n in client.networks.list()} == networks  # host network only
        # A restarted runner container keeps its name (and so removes its own leftovers).
        names = runner_names(project)
        assert len(names) == 1 and names[0].startswith("compose-")
        restart = run([*compose_cli(), *project, "restart", "runner"], 120)
        assert restart.returncode == 0, restart.stderr
        wait_until(lambda: len(runner_names(project)) == 2, 120, "the runner registering again")
        assert len(set(runner_names(project))) == 1
    finally:
        run([*compose_cli(), *project, "down", "-v", "--remove-orphans"], 120)
