"""A local git repository of `leakyfixture`'s source, for bisecting commits between two releases.

`build_repo(dest)` makes, in `dest`:

- `initial import` (version 1.0.4) and `release 1.0.5`, tagged `v1.0.5` (clean);
- `commits` commits after it, the last tagged `v1.0.6` (version 1.0.6); commit k (1-based,
  counting after v1.0.5) has version `1.0.6.devk`, and the last one `1.0.6`;
- commit `leaking` introduces the leak (its subject says so); every commit from it on leaks
  1 MiB per `step()`, the module being fixture.py's `module_source` for that version;
- commit `broken` (None: none) does not build: it moves the version into `leakyfixture/VERSION`
  and forgets to add the file, so the build backend fails; the next commit adds it.

It builds fully offline: `pyproject.toml` names an in-tree PEP 517 backend
(`_build/fixture_backend.py`, `requires = []`) that writes the wheel and sdist zips itself.

SHAs are deterministic: fixed author and committer, a date an hour apart per commit,
`init.defaultBranch=main`, and no global or system git config read, so two builds of the
same arguments give the same SHAs.

`serve_repo(repo)` serves a bare copy of it over git's smart HTTP protocol (`git
http-backend`, `service.example.githttp`) on 127.0.0.1, as a forge serves a public
repository: what the service's runners clone and uv builds `pkg @ git+http://...@SHA`
from, offline. (A commits listing refuses git's dumb protocol: it cannot leave out file
contents, so it sends the whole repository.)
"""

from __future__ import annotations

import os
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from service.example.fixture import NAME, FixtureSpec, module_source
from service.example.githttp import serve_smart

OLD_TAG = "v1.0.5"
NEW_TAG = "v1.0.6"
LEAK_SUBJECT = "cache decoded frames in a module-level list (introduces the leak)"
BROKEN_SUBJECT = "build: read the version from leakyfixture/VERSION"
FIX_SUBJECT = "build: add the leakyfixture/VERSION file the last commit forgot"
# Clean commits take these subjects in turn.
_SUBJECTS = (
    "docs: explain the noise knobs",
    "step(): build the churn list with a comprehension",
    "tests: cover the cache fill",
    "refactor: name the spike phases",
    "docs: fix a typo in the module docstring",
    "style: sort the module constants",
    "ci: run on Python 3.12",
    "chore: bump the copyright year",
    "docs: a README section on the step marker",
    "refactor: one helper for touched buffers",
    "tests: pin the spike size",
    "chore: drop an unused import",
)
_IDENTITY = {
    "GIT_AUTHOR_NAME": "Fixture Author",
    "GIT_AUTHOR_EMAIL": "author@leakyfixture.invalid",
    "GIT_COMMITTER_NAME": "Fixture Committer",
    "GIT_COMMITTER_EMAIL": "committer@leakyfixture.invalid",
}
_EPOCH = 1706745600  # 2024-02-01T00:00:00Z


@dataclass(frozen=True)
class GitFixture:
    path: Path
    old_tag: str
    new_tag: str
    # (sha, subject) of each commit after old_tag, oldest first; the last one is new_tag.
    commits: tuple[tuple[str, str], ...]
    leaking_sha: str
    broken_sha: str | None

    @property
    def tags(self) -> tuple[str, str]:
        return (self.old_tag, self.new_tag)


_PYPROJECT = """\
[build-system]
requires = []
build-backend = "fixture_backend"
backend-path = ["_build"]

[project]
name = "leakyfixture"
{version_line}
description = "Synthetic releases for leakbisect tests; leaks from a known commit on."
requires-python = ">=3.8"
"""

_BACKEND = '''\
"""An in-tree PEP 517 backend: builds leakyfixture's wheel and sdist with zipfile/tarfile only.

The version is `version = "..."` in pyproject.toml, or, with `dynamic = ["version"]`,
the content of leakyfixture/VERSION.
"""

import base64
import hashlib
import io
import os
import re
import tarfile
import zipfile

NAME = "leakyfixture"
TAG = "py3-none-any"
_DATE = (2024, 1, 1, 0, 0, 0)


def _version():
    with open("pyproject.toml") as f:
        text = f.read()
    found = re.search(r'^version = "([^"]+)"$', text, re.M)
    if found:
        return found.group(1)
    with open(os.path.join(NAME, "VERSION")) as f:
        return f.read().strip()


def _metadata(version):
    return (
        "Metadata-Version: 2.1\\nName: {0}\\nVersion: {1}\\n"
        "Summary: Synthetic releases for leakbisect tests\\nRequires-Python: >=3.8\\n"
    ).format(NAME, version)


def _sources():
    return sorted(
        os.path.join(NAME, n) for n in os.listdir(NAME) if n.endswith(".py") or n == "VERSION"
    )


def _hash(data):
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
    return "sha256=" + digest.decode()


def get_requires_for_build_wheel(config_settings=None):
    return []


def get_requires_for_build_sdist(config_settings=None):
    return []


def prepare_metadata_for_build_wheel(metadata_directory, config_settings=None):
    version = _version()
    dist_info = "{0}-{1}.dist-info".format(NAME, version)
    os.makedirs(os.path.join(metadata_directory, dist_info), exist_ok=True)
    with open(os.path.join(metadata_directory, dist_info, "METADATA"), "w") as f:
        f.write(_metadata(version))
    return dist_info


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    version = _version()
    dist_info = "{0}-{1}.dist-info".format(NAME, version)
    content = {}
    for path in _sources():
        with open(path, "rb") as f:
            content[path.replace(os.sep, "/")] = f.read()
    content[dist_info + "/METADATA"] = _metadata(version).encode()
    content[dist_info + "/WHEEL"] = (
        "Wheel-Version: 1.0\\nGenerator: fixture_backend\\nRoot-Is-Purelib: true\\nTag: "
        + TAG + "\\n"
    ).encode()
    record = ["{0},{1},{2}".format(n, _hash(d), len(d)) for n, d in content.items()]
    record.append(dist_info + "/RECORD,,")
    content[dist_info + "/RECORD"] = ("\\n".join(record) + "\\n").encode()
    filename = "{0}-{1}-{2}.whl".format(NAME, version, TAG)
    with zipfile.ZipFile(os.path.join(wheel_directory, filename), "w", zipfile.ZIP_DEFLATED) as zf:
        for n, data in content.items():
            info = zipfile.ZipInfo(n, date_time=_DATE)
            info.external_attr = 0o644 << 16
            zf.writestr(info, data, compress_type=zipfile.ZIP_DEFLATED)
    return filename


def build_sdist(sdist_directory, config_settings=None):
    version = _version()
    base = "{0}-{1}".format(NAME, version)
    files = ["pyproject.toml", os.path.join("_build", "fixture_backend.py"), *_sources()]
    filename = base + ".tar.gz"
    with tarfile.open(os.path.join(sdist_directory, filename), "w:gz") as tf:
        for path in files:
            tf.add(path, arcname=base + "/" + path.replace(os.sep, "/"))
        pkg_info = _metadata(version).encode()
        info = tarfile.TarInfo(base + "/PKG-INFO")
        info.size = len(pkg_info)
        tf.addfile(info, io.BytesIO(pkg_info))
    return filename
'''


def _git(repo: Path, *args: str, date: int | None = None) -> str:
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(repo),  # belt and braces: no ~/.gitconfig or XDG config of the user
        "GIT_CONFIG_GLOBAL": "/dev/null",
        "GIT_CONFIG_NOSYSTEM": "1",
        "LC_ALL": "C",
        **_IDENTITY,
    }
    if date is not None:
        env["GIT_AUTHOR_DATE"] = env["GIT_COMMITTER_DATE"] = f"@{date} +0000"
    cmd = ["git", "-c", "init.defaultBranch=main", "-c", "commit.gpgsign=false", *args]
    done = subprocess.run(cmd, cwd=repo, env=env, capture_output=True, text=True, timeout=60)
    if done.returncode != 0:
        raise RuntimeError(f"git {' '.join(args)} failed: {done.stderr.strip()}")
    return done.stdout.strip()


def _write_tree(repo: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        path = repo / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def _commit(repo: Path, subject: str, n: int) -> str:
    _git(repo, "add", "--all")
    _git(repo, "commit", "--quiet", "--allow-empty", "-m", subject, date=_EPOCH + 3600 * n)
    return _git(repo, "rev-parse", "HEAD")


def build_repo(
    dest: Path, *, commits: int = 12, leaking: int = 7, broken: int | None = 4
) -> GitFixture:
    """Create the repository in `dest` (which must not exist or be empty); see the module doc."""
    if commits < 1 or not 1 <= leaking <= commits:
        raise ValueError(f"need 1 <= leaking <= commits, got leaking={leaking} commits={commits}")
    if broken is not None and (not 1 <= broken < commits or broken == leaking):
        raise ValueError(f"need 1 <= broken < commits and broken != leaking, got broken={broken}")
    repo = Path(dest)
    repo.mkdir(parents=True, exist_ok=True)
    _git(repo, "init", "--quiet")
    spec = FixtureSpec(first_leaking=f"1.0.6.dev{leaking}" if leaking < commits else "1.0.6")
    backend = {"_build/fixture_backend.py": _BACKEND}

    def release(version: str, dynamic: bool) -> dict[str, str]:
        line = 'dynamic = ["version"]' if dynamic else f'version = "{version}"'
        files = {
            **backend,
            "pyproject.toml": _PYPROJECT.format(version_line=line),
            f"{NAME}/__init__.py": module_source(spec, version),
        }
        if dynamic:
            files[f"{NAME}/VERSION"] = version + "\n"
        return files

    _write_tree(repo, release("1.0.4", False))
    _commit(repo, "initial import", 0)
    _write_tree(repo, release("1.0.5", False))
    _commit(repo, "release 1.0.5", 1)
    _git(repo, "tag", OLD_TAG)

    out: list[tuple[str, str]] = []
    clean = iter(_SUBJECTS * (commits // len(_SUBJECTS) + 1))
    dynamic = False
    for k in range(1, commits + 1):
        version = "1.0.6" if k == commits else f"1.0.6.dev{k}"
        if k == broken:
            dynamic = True
        files = release(version, dynamic)
        if k == broken:
            del files[f"{NAME}/VERSION"]
        if k == leaking:
            subject = LEAK_SUBJECT
        elif k == broken:
            subject = BROKEN_SUBJECT
        elif broken is not None and k == broken + 1:
            subject = FIX_SUBJECT
        elif k == commits:
            subject = "release 1.0.6"
        else:
            subject = next(clean)
        _write_tree(repo, files)
        out.append((_commit(repo, subject, k + 1), subject))
    _git(repo, "tag", NEW_TAG)
    return GitFixture(
        path=repo,
        old_tag=OLD_TAG,
        new_tag=NEW_TAG,
        commits=tuple(out),
        leaking_sha=out[leaking - 1][0],
        broken_sha=None if broken is None else out[broken - 1][0],
    )


@contextmanager
def serve_repo(repo: Path, port: int = 0) -> Iterator[str]:
    """Serve a bare copy of `repo` (as it is now) on 127.0.0.1 while the block runs; yields
    its URL, `http://127.0.0.1:PORT/leakyfixture.git`."""
    with tempfile.TemporaryDirectory(prefix="leakyfixture-git-") as root:
        bare = Path(root) / f"{NAME}.git"
        _git(Path(root), "clone", "--quiet", "--bare", str(Path(repo).resolve()), str(bare))
        with serve_smart(Path(root), port=port) as base:
            yield f"{base}/{bare.name}"
