"""A local git repository of a tiny package, for tests that build from a commit.

`make_repo(path)` creates the repository with `commit(...)` helpers; each commit of
package `name` holds ``<name>.py`` and an in-tree PEP 517 backend (``_build``,
``backend-path``), so uv builds it with no network and no build requirements. The
backend writes the wheel with `zipfile`; `broken=True` commits a backend whose
`build_wheel` raises ``RuntimeError(BROKEN_MESSAGE)``. Author, committer and dates
are fixed, so the same commits give the same shas.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

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
