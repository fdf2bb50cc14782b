"""A local git repository of a tiny package, for tests that build from a commit.

`make_repo(path)` creates the repository with `commit(...)` helpers; each commit of
package `name` holds ``<name>.py`` and an in-tree PEP 517 backend (``_build``,
``backend-path``), so uv builds it with no network and no build requirements. The
backend writes the wheel with `zipfile`; `broken=True` commits a backend whose
`build_wheel` raises ``RuntimeError(BROKEN_MESSAGE)``. Author, committer and dates
are fixed, so the same commits give the same shas.

For the bounds of a commits listing (tests/test_git_bounds.py), servers on 127.0.0.1:
`serve_static` (git's dumb HTTP protocol: plain files, counting the bytes it sends),
`serve_slow` (accepts, answers 200 and trickles a byte every `TRICKLE_S`, for ever), and
`large_repo` (a bare repository of incompressible blobs, packed, ready for both
protocols). `processes_with(text)` lists the processes whose command line holds `text`.
"""

from __future__ import annotations

import functools
import os
import subprocess
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from service.example.index import serving

BROKEN_MESSAGE = "fixture backend: this commit does not build"

_PYPROJECT = """\
[build-system]
requires = []
build-backend = "fixture_backend"
backend-path = ["_build"]
"""

_BACKEND = '''\
"""An in-tree PEP 517 backend: a wheel of {name}.py, written with zipfile."""

import base64
import hashlib
import os
import zipfile

NAME, VERSION = {name!r}, {version!r}
DIST = f"{{NAME}}-{{VERSION}}"
BROKEN = {broken!r}


def _metadata():
    return f"Metadata-Version: 2.1\\nName: {{NAME}}\\nVersion: {{VERSION}}\\n"


def get_requires_for_build_wheel(config_settings=None):
    return []


def get_requires_for_build_sdist(config_settings=None):
    return []


def prepare_metadata_for_build_wheel(metadata_directory, config_settings=None):
    info = os.path.join(metadata_directory, f"{{DIST}}.dist-info")
    os.makedirs(info, exist_ok=True)
    with open(os.path.join(info, "METADATA"), "w") as fh:
        fh.write(_metadata())
    return f"{{DIST}}.dist-info"


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    if BROKEN:
        raise RuntimeError({broken_message!r})
    with open(f"{{NAME}}.py", "rb") as fh:
        files = {{f"{{NAME}}.py": fh.read()}}
    files[f"{{DIST}}.dist-info/METADATA"] = _metadata().encode()
    files[f"{{DIST}}.dist-info/WHEEL"] = (
        b"Wheel-Version: 1.0\\nGenerator: fixture\\nRoot-Is-Purelib: true\\nTag: py3-none-any\\n"
    )
    record = []
    for path, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{{path}},sha256={{digest}},{{len(data)}}")
    record.append(f"{{DIST}}.dist-info/RECORD,,")
    files[f"{{DIST}}.dist-info/RECORD"] = ("\\n".join(record) + "\\n").encode()
    wheel = f"{{DIST}}-py3-none-any.whl"
    with zipfile.ZipFile(os.path.join(wheel_directory, wheel), "w") as zf:
        for path, data in files.items():
            zf.writestr(path, data)
    return wheel


def build_sdist(sdist_directory, config_settings=None):
    raise NotImplementedError("fixture backend: wheels only")
'''


@dataclass
class GitRepo:
    path: Path
    name: str
    commits: int = 0

    def git(self, *args: str) -> str:
        # Fixed identities and dates (one minute apart): reproducible shas.
        when = f"2024-01-01T00:{self.commits:02d}:00Z"
        env = {
            **os.environ,
            "GIT_AUTHOR_NAME": "fixture", "GIT_AUTHOR_EMAIL": "fixture@example.invalid",
            "GIT_COMMITTER_NAME": "fixture", "GIT_COMMITTER_EMAIL": "fixture@example.invalid",
            "GIT_AUTHOR_DATE": when, "GIT_COMMITTER_DATE": when,
            "GIT_CONFIG_GLOBAL": os.devnull, "GIT_CONFIG_NOSYSTEM": "1",
        }  # fmt: skip
        proc = subprocess.run(
            ["git", *args], cwd=self.path, env=env, capture_output=True, text=True, check=True
        )
        return proc.stdout.strip()

    def commit(self, source: str, *, version: str = "0.1", broken: bool = False) -> str:
        """Commit ``<name>.py`` with `source` and the backend; returns the commit's sha."""
        (self.path / "pyproject.toml").write_text(_PYPROJECT)
        (self.path / "_build").mkdir(exist_ok=True)
        backend = _BACKEND.format(
            name=self.name, version=version, broken=broken, broken_message=BROKEN_MESSAGE
        )
        (self.path / "_build" / "fixture_backend.py").write_text(backend)
        (self.path / f"{self.name}.py").write_text(source)
        self.git("add", "-A")
        self.git("commit", "-q", "-m", f"commit {self.commits}")
        self.commits += 1
        return self.git("rev-parse", "HEAD")


def make_repo(path: Path, name: str = "gitpkg") -> GitRepo:
    """An empty repository at `path` (created). Under a directory every user can reach
    (the `reachable_tmp` fixture), the build user can read it (files are 0644 under umask 022).
    """
    path.mkdir(parents=True, exist_ok=True)
    repo = GitRepo(path, name)
    repo.git("init", "-q", "-b", "main")
    return repo


TRICKLE_S = 0.05


def bare_copy(repo: Path, dest: Path) -> Path:
    """A bare clone of `repo` at `dest`, with the files git's dumb HTTP protocol reads."""
    quiet = {**os.environ, "GIT_CONFIG_GLOBAL": os.devnull, "GIT_CONFIG_NOSYSTEM": "1"}
    subprocess.run(["git", "clone", "--quiet", "--bare", str(repo), str(dest)], env=quiet,
                   check=True, capture_output=True)  # fmt: skip
    subprocess.run(["git", "update-server-info"], cwd=dest, env=quiet, check=True)
    return dest


def large_repo(dest: Path, *, megabytes: int) -> Path:
    """A bare repository `dest` whose one commit (tagged v1.0 and v2.0) holds `megabytes`
    MiB of random bytes in 1 MiB files: no compression or delta makes it smaller."""
    work = make_repo(dest.with_name(dest.name + "-work"), "big")
    for i in range(megabytes):
        (work.path / f"blob{i}").write_bytes(os.urandom(1 << 20))
    work.git("add", "-A")
    work.git("commit", "-q", "-m", "large files")
    work.git("tag", "v1.0")
    (work.path / "NEWS").write_text("2.0\n")
    work.git("add", "-A")
    work.git("commit", "-q", "-m", "release 2.0")
    work.git("tag", "v2.0")
    bare_copy(work.path, dest)
    return dest


class _Counted(SimpleHTTPRequestHandler):
    """Static files; adds what it sends to the server's ``sent`` count."""

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - the base's name
        pass

    def copyfile(self, source, outputfile) -> None:  # type: ignore[no-untyped-def]
        while chunk := source.read(65536):
            outputfile.write(chunk)
            self.server.sent += len(chunk)  # type: ignore[attr-defined]


@contextmanager
def serve_static(root: Path) -> Iterator[tuple[str, ThreadingHTTPServer]]:
    """`root` as plain files (git's dumb HTTP protocol); yields the base URL and the server,
    whose ``sent`` is the bytes of file contents sent so far."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_Counted, directory=root))
    server.sent = 0  # type: ignore[attr-defined]
    with serving(server, "git-dumb-http") as port:
        yield f"http://127.0.0.1:{port}", server


class _Trickle(BaseHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - the base's name
        pass

    def do_GET(self) -> None:  # noqa: N802 - the base's name
        self.send_response(200)
        self.send_header("Content-Type", "application/x-git-upload-pack-advertisement")
        self.end_headers()
        stop: threading.Event = self.server.stop  # type: ignore[attr-defined]
        try:
            while not stop.wait(TRICKLE_S):
                self.wfile.write(b"0")
                self.wfile.flush()
        except OSError:
            pass  # the client went away


@contextmanager
def serve_slow() -> Iterator[str]:
    """A server that answers every request with a byte per `TRICKLE_S`, until the block
    ends; yields a repository URL on it."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Trickle)
    server.stop = threading.Event()  # type: ignore[attr-defined]
    try:
        with serving(server, "git-slow-http") as port:
            yield f"http://127.0.0.1:{port}/slow.git"
    finally:
        server.stop.set()  # type: ignore[attr-defined]


def processes_with(text: str) -> list[tuple[int, str]]:
    """(pid, command line) of every process whose command line holds `text`."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        try:
            with open(f"/proc/{name}/cmdline", "rb") as f:
                cmdline = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if text in cmdline:
            found.append((int(name), cmdline))
    return found
