"""runners.envs against real uv, real venvs and the offline fixture index on 127.0.0.1.

Every build uses the local index only (`--index-url`), and one uv cache per test
session, so nothing here touches the network or the user's cache.
"""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import os
import subprocess
import sys
import time
import zipfile
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from contract.envargs import exclude_newer_arg, freeze_diff
from contract.errors import Unavailable
from contract.wire import EnvSpec
from runners import envs, publish, users, uvrun
from runners.envs import EnvError, build_env, find_python, resolve_pins, spec_hash
from service.example.fixture import FixtureSpec, build_fixture, pack_wheel
from service.example.index import serve_index
from service.models import Candidate, Job, Trial
from service.specs import trial_spec
from tests.gitfixture import BROKEN_MESSAGE, make_repo

pytestmark = pytest.mark.timeout(120)

FIXTURE = FixtureSpec()


def _write_helper_wheel(dest: Path, version: str) -> None:
    """A second project, `fixturehelper`, so constraints have something to hold."""
    dist = f"fixturehelper-{version}"
    files = {
        "fixturehelper/__init__.py": f"__version__ = {version!r}\n".encode(),
        f"{dist}.dist-info/METADATA": (
            f"Metadata-Version: 2.1\nName: fixturehelper\nVersion: {version}\n"
        ).encode(),
        f"{dist}.dist-info/WHEEL": (
            b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        ),
    }
    record = []
    for name, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{name},sha256={digest},{len(data)}")
    record.append(f"{dist}.dist-info/RECORD,,")
    files[f"{dist}.dist-info/RECORD"] = ("\n".join(record) + "\n").encode()
    with zipfile.ZipFile(dest / f"{dist}-py3-none-any.whl", "w") as zf:
        for name, data in files.items():
            zf.writestr(name, data)


@pytest.fixture(scope="session")
def index_url(tmp_path_factory: pytest.TempPathFactory):
    wheels = build_fixture(tmp_path_factory.mktemp("wheels"))
    for version in ("1.0", "2.0"):
        _write_helper_wheel(wheels, version)
    with serve_index(wheels) as url:
        yield url


@pytest.fixture(scope="session")
def cache_dir(reachable_dir) -> Path:
    return reachable_dir("uv-cache")


@pytest.fixture
def build(reachable_tmp: Path, cache_dir: Path, index_url: str):
    root = reachable_tmp / "envs"

    def _build(version: str = "1.0.2", **kw):
        kw.setdefault("index_url", index_url)
        kw.setdefault("package", "leakyfixture")
        spec = EnvSpec(version=version, **kw)
        return build_env(spec, root=root, cache_dir=cache_dir)

    _build.root = root
    _build.cache = cache_dir
    _build.index_url = index_url
    return _build


def _venv_dirs(root: Path) -> list[Path]:
    """The published environments of a run without an owner."""
    local = root / publish.LOCAL_OWNER
    return [p for p in local.iterdir() if p.is_dir()] if local.exists() else []


def test_build_installs_the_candidate_and_reuses_it(build, cache_dir: Path) -> None:
    lines: list[str] = []
    first = build("1.0.2")
    assert first.ok, first.error
    assert not first.reused
    assert first.resolution == "free" and first.resolution_note is None
    assert "leakyfixture==1.0.2" in first.freeze
    spec = EnvSpec(package="leakyfixture", version="1.0.2", index_url=build.index_url)
    assert Path(first.path) == build.root / publish.LOCAL_OWNER / spec_hash(spec)
    assert first.python_executable == str(Path(first.path) / "bin" / "python")
    # -B: run as root, this import could write bytecode into the published environment (a
    # trial runs as the trial user and cannot), and the reuse below would see changed files.
    out = subprocess.run(
        [first.python_executable, "-B", "-c",
         "import leakyfixture; print(leakyfixture.__version__)"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert out.stdout.strip() == "1.0.2"
    # As a user, installed from the cache by hard link (cache and envs share a filesystem);
    # as root copied: a published file is never an inode the build user's cache holds.
    module = next(Path(first.path).glob("lib/python*/site-packages/leakyfixture/__init__.py"))
    if os.geteuid() == 0:
        assert module.stat().st_nlink == 1 and module.stat().st_uid == 0
        assert module.stat().st_mode & 0o7777 == 0o444
    else:
        assert module.stat().st_nlink > 1

    second = build_env(spec, root=build.root, cache_dir=cache_dir, log=lines.append)
    assert second.ok and second.reused
    assert second.path == first.path
    assert second.freeze == first.freeze
    assert any(line.startswith("reusing ") for line in lines)


def test_half_built_env_is_removed_and_rebuilt(build) -> None:
    first = build("1.0.2")
    assert first.ok
    (Path(first.path) / envs.MARKER).unlink()
    (Path(first.path) / "leftover").write_text("from an interrupted build")
    again = build("1.0.2")
    assert again.ok and not again.reused
    assert again.path == first.path
    assert not (Path(again.path) / "leftover").exists()
    assert (Path(again.path) / envs.MARKER).exists()
    assert build("1.0.2").reused


def test_changed_env_is_rebuilt(build) -> None:
    first = build("1.0.2")
    subprocess.run(
        [envs.uv_bin(), "pip", "uninstall", "--python", first.python_executable, "leakyfixture"],
        capture_output=True, check=True,
    )  # fmt: skip
    again = build("1.0.2")
    assert again.ok and not again.reused
    assert "leakyfixture==1.0.2" in again.freeze


def test_constraints_hold_other_packages(build) -> None:
    # The candidate's own pin among the constraints is dropped, not a conflict.
    result = build(
        "1.0.2",
        requirements=["fixturehelper"],
        constraints=["fixturehelper==1.0", "leakyfixture==1.0.0"],
    )
    assert result.ok, result.error
    assert result.resolution == "constrained"
    assert result.resolution_note is None
    assert {"fixturehelper==1.0", "leakyfixture==1.0.2"} <= set(result.freeze)
    constraints = (Path(result.path) / envs.CONSTRAINTS_FILE).read_text()
    assert constraints == "fixturehelper==1.0\n"


def test_unresolvable_constraints_fall_back_to_free(build) -> None:
    result = build("1.0.2", requirements=["fixturehelper>=2"], constraints=["fixturehelper==1.0"])
    assert result.ok, result.error
    assert result.resolution == "free"
    assert "fixturehelper==2.0" in result.freeze
    note = result.resolution_note
    assert note is not None and "\n" not in note
    assert note.startswith("held pins did not resolve, resolved freely: Because ")
    assert "fixturehelper>=2" in note and "fixturehelper==1.0" in note
    # The reused environment reports the same resolution.
    again = build("1.0.2", requirements=["fixturehelper>=2"], constraints=["fixturehelper==1.0"])
    assert again.reused and again.resolution == "free" and again.resolution_note == note


def test_as_released_cuts_off_at_the_upload_time(build) -> None:
    uploaded = FIXTURE.upload_time("1.0.2")

    before = build("1.0.2", exclude_newer=uploaded - timedelta(milliseconds=1))
    assert not before.ok
    assert before.resolution == "as-released"
    assert "No solution found when resolving dependencies" in before.error
    assert "exclude-newer" in before.error
    assert "Using Python" not in before.error
    assert _venv_dirs(build.root) == []

    at = build("1.0.2", exclude_newer=uploaded)  # inclusive: uploaded at the cutoff counts
    assert at.ok, at.error
    assert at.resolution == "as-released"
    assert "leakyfixture==1.0.2" in at.freeze

    naive_after = build(
        "1.0.2", exclude_newer=(uploaded + timedelta(hours=12)).replace(tzinfo=None)
    )
    assert naive_after.ok, naive_after.error


def test_exclude_newer_arg() -> None:
    when = datetime(2024, 1, 3, tzinfo=UTC)
    assert exclude_newer_arg(when) == "2024-01-03T00:00:00.001Z"
    assert exclude_newer_arg(when + timedelta(microseconds=999)) == "2024-01-03T00:00:00.001Z"
    assert exclude_newer_arg(datetime(2024, 1, 3, 1)) == "2024-01-03T01:00:00.001Z"


def test_foreign_platform_only_release_cannot_be_built(build) -> None:
    assert FIXTURE.foreign_only == "1.0.4"
    result = build("1.0.4")
    assert not result.ok
    assert result.path is None and result.freeze == []
    assert "no wheels with a matching platform tag" in result.error
    assert len(result.error.splitlines()) <= envs.ERROR_LINES
    assert _venv_dirs(build.root) == []


def test_missing_version_cannot_be_built(build) -> None:
    result = build("1.0.77")
    assert not result.ok
    assert "there is no version of leakyfixture==1.0.77" in result.error


def test_caller_uv_settings_do_not_leak_in(build, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("UV_EXCLUDE_NEWER", "2000-01-01T00:00:00Z")
    monkeypatch.setenv("UV_INDEX_URL", "http://127.0.0.1:9/simple")
    monkeypatch.setenv("UV_CONSTRAINT", "/nonexistent/constraints.txt")
    result = build("1.0.1")
    assert result.ok, result.error


def test_uv_env_passes_tls_settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SSL_CERT_FILE", "/etc/ssl/certs/ca-certificates.crt")
    monkeypatch.setenv("UV_NATIVE_TLS", "1")
    monkeypatch.setenv("UV_PYTHON", "3.8")
    monkeypatch.setenv("VIRTUAL_ENV", str(tmp_path))
    env = uvrun.uv_env(tmp_path / "cache", link_from=tmp_path)
    assert env["SSL_CERT_FILE"] == "/etc/ssl/certs/ca-certificates.crt"
    assert env["UV_NATIVE_TLS"] == "1"
    assert "UV_PYTHON" not in env and "VIRTUAL_ENV" not in env
    assert env["UV_CACHE_DIR"] == str(tmp_path / "cache")
    assert env["UV_PYTHON_DOWNLOADS"] == "never"
    (tmp_path / "cache").mkdir()
    assert uvrun.uv_env(tmp_path / "cache", link_from=tmp_path)["UV_LINK_MODE"] == "hardlink"


def test_spec_hash_covers_the_whole_spec() -> None:
    base = EnvSpec(package="leakyfixture", version="1.0.2", requirements=["a", "b"])
    assert spec_hash(base) == spec_hash(base.model_copy())
    assert spec_hash(base) == spec_hash(base.model_copy(update={"requirements": ["b", "a"]}))
    changes = {
        "version": "1.0.3",
        "python": "3.12",
        "requirements": ["a"],
        "index_url": "http://127.0.0.1:1/simple",
        "extra_index_urls": ["http://127.0.0.1:2/simple"],
        "find_links": ["/wheels"],
        "pre": True,
        "constraints": ["a==1"],
        "exclude_newer": datetime(2024, 1, 1, tzinfo=UTC),
    }
    hashes = {spec_hash(base.model_copy(update={k: v})) for k, v in changes.items()}
    assert len(hashes) == len(changes) and spec_hash(base) not in hashes


def test_resolve_pins(index_url: str, cache_dir: Path) -> None:
    spec = EnvSpec(
        package="leakyfixture", version="1.0.2", requirements=["fixturehelper"], index_url=index_url
    )
    assert resolve_pins(spec, cache_dir=cache_dir) == ["fixturehelper==2.0", "leakyfixture==1.0.2"]


def test_resolve_pins_unresolvable(index_url: str, cache_dir: Path) -> None:
    spec = EnvSpec(package="leakyfixture", version="1.0.4", index_url=index_url)
    with pytest.raises(
        EnvError, match=r"^cannot resolve leakyfixture==1\.0\.4: Because .*platform"
    ):
        resolve_pins(spec, cache_dir=cache_dir)


def test_find_python() -> None:
    running = f"{sys.version_info.major}.{sys.version_info.minor}"
    for request in (None, running):
        path = find_python(request)
        out = subprocess.run(
            [path, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
            capture_output=True, text=True, check=True,
        )  # fmt: skip
        assert out.stdout.strip() == running
    with pytest.raises(EnvError) as info:
        find_python("3.99")
    assert str(info.value) == (
        "python 3.99 is not available: No interpreter found for Python 3.99 in virtual "
        "environments, managed installations, or search path"
    )


def test_unavailable_python_is_an_env_error(build) -> None:
    with pytest.raises(EnvError, match=r"^python 3\.99 is not available: "):
        build("1.0.2", python="3.99")


@pytest.mark.parametrize(
    ("a", "b", "expected"),
    [
        ([], [], []),
        (["x==1"], ["x==1"], []),
        (["x==1", "y==2"], ["y==3", "x==1"], [("y", "2", "3")]),
        (["only-a==1"], [], [("only-a", "1", None)]),
        ([], ["Only_B==2"], [("Only_B", None, "2")]),
        (["Foo.Bar==1"], ["foo-bar==2"], [("Foo.Bar", "1", "2")]),
        (["b==1", "a==1", "c==1"], ["c==2", "a==2", "b==1"], [("a", "1", "2"), ("c", "1", "2")]),
        (["p @ file:///w/p-1.whl"], ["p==1"], [("p", "file:///w/p-1.whl", "1")]),
        (["# comment", "", "-e file:///src", "q==1"], ["q==1"], []),
    ],
)
def test_freeze_diff(a: list[str], b: list[str], expected) -> None:
    assert freeze_diff(a, b) == expected


def test_unparsable_requirement(tmp_path: Path) -> None:
    spec = EnvSpec(package="leakyfixture", version="1.0.2", requirements=["numpy", "foo>="])
    with pytest.raises(EnvError) as info:
        build_env(spec, root=tmp_path / "envs", cache_dir=tmp_path / "cache")
    assert str(info.value) == (
        "requirement 'foo>=' does not parse: "
        "Expected semicolon (after name with no version specifier) or end"
    )
    assert not (tmp_path / "envs").exists() or _venv_dirs(tmp_path / "envs") == []
    with pytest.raises(EnvError, match=r"^constraint 'bar==' does not parse: "):
        bad = spec.model_copy(update={"requirements": [], "constraints": ["bar=="]})
        build_env(bad, root=tmp_path / "envs", cache_dir=tmp_path / "cache")
    with pytest.raises(EnvError, match=r"^requirement 'foo>=' does not parse: "):
        resolve_pins(spec)


def test_default_cache_dir(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("UV_CACHE_DIR", str(tmp_path / "uv"))
    assert envs.default_cache_dir() == tmp_path / "uv"
    monkeypatch.delenv("UV_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert envs.default_cache_dir() == tmp_path / "leakbisect" / "uv"


def test_errors_are_trimmed() -> None:
    stderr = "\n".join(
        ["Using Python 3.11.7 environment at: /x", "Resolved 3 packages in 1ms", ""]
        + [f"  cause: line {i}" for i in range(40)]
    )
    trimmed = uvrun.meaningful(stderr)
    assert trimmed.splitlines() == [f"  cause: line {i}" for i in range(20, 40)]


# ---------------------------------------------------------------------------
# strict mixes


@pytest.fixture(scope="session")
def mix_links(reachable_dir) -> str:
    """find-links wheels for mixes: mixb 1.0 needs mixc, mixb 2.0 needs mixc>=2."""
    links = reachable_dir("mix-wheels")
    for name, version, requires in [
        ("mixb", "1.0", ["mixc"]),
        ("mixb", "2.0", ["mixc>=2"]),
        ("mixc", "1.0", []),
        ("mixc", "2.0", []),
    ]:
        module = {f"{name}/__init__.py": f"__version__ = {version!r}\n".encode()}
        pack_wheel(links / f"{name}-{version}-py3-none-any.whl", name, version, module,
                   summary="a mix test wheel", requires_dist=requires)  # fmt: skip
    return str(links)


def _mix(build, mix_links: str, version: str, *, strict: bool = True):
    pins = ["mixb==1.0", "mixc==1.0", "fixturehelper==1.0"]
    return build(version, base_env=True, strict=strict, constraints=pins,
                 find_links=[mix_links], package="mixb")  # fmt: skip


def test_strict_mix_installs_exactly_the_pins(build, mix_links: str) -> None:
    result = _mix(build, mix_links, "1.0")
    assert result.ok, result.error
    assert result.resolution == "strict" and result.resolution_note is None
    assert not result.unresolvable
    assert result.freeze == ["fixturehelper==1.0", "mixb==1.0", "mixc==1.0"]
    venv = Path(result.path)
    assert (venv / envs.BASE_FILE).read_text() == "mixc\nfixturehelper\n"
    assert (venv / envs.CONSTRAINTS_FILE).read_text() == "mixc==1.0\nfixturehelper==1.0\n"
    again = _mix(build, mix_links, "1.0")
    assert again.reused and again.resolution == "strict"


def test_strict_mix_that_cannot_resolve_is_unresolvable(build, mix_links: str) -> None:
    result = _mix(build, mix_links, "2.0")
    assert not result.ok and result.unresolvable
    assert result.resolution == "strict" and result.path is None and result.freeze == []
    assert result.error == (
        "Because mixb>=2.0 depends on mixc>=2 and you require mixb==2.0, we can conclude that "
        "you require mixc>=2. And because you require mixc==1.0, we can conclude that your "
        "requirements are unsatisfiable."
    )
    assert _venv_dirs(build.root) == []
    # The same mix, not strict: the base environment leaves the pin uv names.
    loose = _mix(build, mix_links, "2.0", strict=False)
    assert loose.ok, loose.error
    assert not loose.unresolvable
    assert loose.resolution == "constrained"
    assert loose.freeze == ["fixturehelper==1.0", "mixb==2.0", "mixc==2.0"]
    assert loose.resolution_note == f"base env, except mixc 1.0 -> 2.0 (uv: {result.error})"


def test_strict_needs_a_base_env(build) -> None:
    with pytest.raises(EnvError) as info:
        build("1.0.2", strict=True, constraints=["fixturehelper==1.0"])
    assert str(info.value) == "strict holds a base environment's pins: it needs base_env"


# ---------------------------------------------------------------------------
# builds from a git source


def _module_text(result) -> str:
    return next(Path(result.path).glob("lib/python*/site-packages/gitpkg.py")).read_text()


def test_source_builds_the_commit(build, reachable_tmp: Path) -> None:
    repo = make_repo(reachable_tmp / "clone")
    first = repo.commit("VALUE = 1\n")
    second = repo.commit("VALUE = 2\n")
    results = {}
    for sha in (first, second):
        source = f"git+file://{repo.path}@{sha}"
        result = build("0.1", package="gitpkg", source=source)
        assert result.ok, result.error
        assert result.freeze == [f"gitpkg @ {source}"]
        assert result.resolution == "free"
        results[sha] = result
    assert _module_text(results[first]) == "VALUE = 1\n"
    assert _module_text(results[second]) == "VALUE = 2\n"
    assert results[first].path != results[second].path
    out = subprocess.run(
        [results[second].python_executable, "-c", "import gitpkg; print(gitpkg.VALUE)"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert out.stdout == "2\n"
    again = build("0.1", package="gitpkg", source=f"git+file://{repo.path}@{first}")
    assert again.reused and again.path == results[first].path


def test_source_that_does_not_build_fails(build, reachable_tmp: Path) -> None:
    repo = make_repo(reachable_tmp / "clone")
    sha = repo.commit("VALUE = 1\n", broken=True)
    result = build("0.1", package="gitpkg", source=f"git+file://{repo.path}@{sha}")
    assert not result.ok and not result.unresolvable
    assert result.path is None and result.freeze == []
    lines = [line.strip() for line in result.error.splitlines()]
    assert lines[0] == f"error: Failed to build `gitpkg @ git+file://{repo.path}@{sha}`"
    assert lines[1:3] == [
        "cause: The build backend returned an error",
        "cause: Call to `fixture_backend.build_wheel` failed (exit status: 1)",
    ]
    assert f"RuntimeError: {BROKEN_MESSAGE}" in lines
    assert _venv_dirs(build.root) == []
    # In a strict mix too, a build failure is a failure, not an unresolvable mix.
    strict = build("0.1", package="gitpkg", source=f"git+file://{repo.path}@{sha}",
                   base_env=True, strict=True, constraints=["fixturehelper==1.0"])  # fmt: skip
    assert not strict.ok and not strict.unresolvable
    assert f"RuntimeError: {BROKEN_MESSAGE}" in [ln.strip() for ln in strict.error.splitlines()]


def test_resolve_pins_of_a_source(index_url: str, cache_dir: Path, reachable_tmp: Path) -> None:
    repo = make_repo(reachable_tmp / "clone")
    sha = repo.commit("VALUE = 1\n")
    source = f"git+file://{repo.path}@{sha}"
    spec = EnvSpec(package="gitpkg", version="0.1", source=source, index_url=index_url,
                   requirements=["fixturehelper==1.0"])  # fmt: skip
    assert resolve_pins(spec, cache_dir=cache_dir) == ["fixturehelper==1.0", f"gitpkg @ {source}"]


@pytest.mark.parametrize(
    "source",
    ["https://example.invalid/x.git@abc", "git+file:///clone", "git+https://git@host/repo",
     "git+https://host@abc", "git+file:///cl one@abc", "git+@abc"],
)  # fmt: skip
def test_source_must_be_a_git_reference(build, source: str) -> None:
    with pytest.raises(EnvError) as info:
        build("0.1", package="gitpkg", source=source)
    assert str(info.value) == f"source {source!r} is not a git+URL@REV reference"


@pytest.mark.skipif(os.geteuid() != 0, reason="builds run as another user only under root")
def test_source_clone_unreadable_by_the_build_user(build, tmp_path: Path) -> None:
    # pytest's tmp_path is under /tmp/pytest-of-root (0700): the build user cannot enter it.
    repo = make_repo(tmp_path / "clone")
    sha = repo.commit("VALUE = 1\n")
    source = f"git+file://{repo.path}@{sha}"
    build_user = envs.identities().build
    closed = next(p for p in reversed(repo.path.parents) if p.stat().st_mode & 0o001 == 0)
    with pytest.raises(EnvError) as info:
        build("0.1", package="gitpkg", source=source)
    assert str(info.value) == (
        f"source {source} is not readable by {build_user}: {users.describe(closed)}; "
        "put the clone in a directory every user can read"
    )


def _old_spec_hash(spec: EnvSpec) -> str:
    """The rule before `strict`, `source` and `reach`: the same data without those keys."""
    data = spec.model_dump(mode="json")
    del data["strict"], data["source"], data["reach"]
    data["requirements"] = sorted(spec.requirements)
    data["constraints"] = sorted(spec.constraints)
    if spec.exclude_newer is not None:
        data["exclude_newer"] = envs._iso(spec.exclude_newer)
    if spec.python is None:
        data["python"] = uvrun.running_python()
    if not spec.base_env:
        del data["base_env"]
    blob = json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def test_spec_hash_keeps_the_names_of_existing_environments() -> None:
    when = datetime(2024, 1, 1, tzinfo=UTC)
    spec = EnvSpec(package="leakyfixture", version="1.0.2", requirements=["b", "a"],
                   constraints=["x==1"], exclude_newer=when)  # fmt: skip
    for one in (spec, spec.model_copy(update={"base_env": True, "python": "3.12"})):
        assert spec_hash(one) == _old_spec_hash(one)
    strict = spec.model_copy(update={"base_env": True, "strict": True})
    source = spec.model_copy(update={"source": "git+file:///clone@abc"})
    hashes = {spec_hash(spec), spec_hash(strict), spec_hash(source),
              spec_hash(spec.model_copy(update={"base_env": True}))}  # fmt: skip
    assert len(hashes) == 4


# ---------------------------------------------------------------------------
# owners and publishing (runners/publish.py)


def test_trial_spec_carries_the_jobs_owner() -> None:
    job = Job(id=1, package="leakyfixture", good="1.0.0", bad="1.0.2", script="print()",
              script_sha256="x", owner="alice")  # fmt: skip
    candidate = Candidate(id=2, job_id=1, position=0, version="1.0.2")
    trial = Trial(id=3, job_id=1, candidate_id=2)
    assert trial_spec(job, candidate, trial).owner == "alice"
    job.owner = None
    assert trial_spec(job, candidate, trial).owner is None


def test_owner_keys_are_hashes() -> None:
    assert publish.owner_key(None) == "local"
    alice = publish.owner_key("alice")
    assert alice.startswith("o-") and "alice" not in alice and len(alice) == 22
    assert publish.owner_key("../bob") != alice and "/" not in publish.owner_key("../bob")


def test_owners_get_their_own_environments(build) -> None:
    spec = EnvSpec(package="leakyfixture", version="1.0.2", index_url=build.index_url)
    a = build_env(spec, root=build.root, cache_dir=build.cache, owner="alice")
    b = build_env(spec, root=build.root, cache_dir=build.cache, owner="bob")
    assert a.ok and b.ok and not b.reused
    assert Path(a.path) == build.root / publish.owner_key("alice") / spec_hash(spec)
    assert Path(b.path) == build.root / publish.owner_key("bob") / spec_hash(spec)
    assert build_env(spec, root=build.root, cache_dir=build.cache, owner="alice").reused
    record = json.loads((Path(a.path) / envs.MARKER).read_text())
    assert record["digest"] == publish.digest(Path(a.path), skip=(envs.MARKER,))
    assert record["fingerprint"] == publish.fingerprint(Path(a.path), skip=(envs.MARKER,))


@pytest.mark.skipif(os.geteuid() != 0, reason="the build user owns nothing unless root")
def test_an_older_runners_env_root_is_taken_over_and_not_trusted(build) -> None:
    """An env root and cache an older runner left to the build user: both become root's;
    an environment found there (even at the new layout's path) is rebuilt, not reused."""
    ids = users.identities()
    spec = EnvSpec(package="leakyfixture", version="1.0.2", index_url=build.index_url)
    planted = build.root / publish.LOCAL_OWNER / spec_hash(spec)
    (planted / "bin").mkdir(parents=True)
    (planted / envs.MARKER).write_text(json.dumps({"freeze": [], "fingerprint": "x"}))
    for path in (build.root, build.cache, *planted.parents[:2], planted, planted / "bin",
                 planted / envs.MARKER):  # fmt: skip
        os.chown(path, ids.build.uid, ids.build.gid)
    result = build_env(spec, root=build.root, cache_dir=build.cache)
    assert result.ok and not result.reused
    for path in (build.root, build.cache, Path(result.path)):
        assert path.stat().st_uid == 0 and not path.stat().st_mode & 0o022
    assert "leakyfixture==1.0.2" in result.freeze


@pytest.mark.skipif(os.geteuid() != 0, reason="only root can own a directory for someone else")
def test_a_root_owned_by_someone_else_is_refused(build, tmp_path: Path) -> None:
    other = build.root.parent / "alices"
    other.mkdir()
    os.chown(other, 4242, 4242)
    with pytest.raises(Unavailable) as info:
        envs.prepare_dirs(other, build.cache)
    assert str(info.value) == (
        f"environment root {other} is owned by uid 4242: it must be root's, the runner writes "
        f"it; run: chown root: {other} && chmod 0755 {other}"
    )


def test_staging_left_by_a_dead_build_is_cleared(build) -> None:
    envs.prepare_dirs(build.root, build.cache)
    staging = build.root / publish.STAGING
    old, new = staging / "abc-dead", staging / "abc-live"
    for path in (old, new):
        (path / "env").mkdir(parents=True)
    stale = time.time() - envs.STALE_STAGING_S - 60
    os.utime(old, (stale, stale))
    envs.prepare_dirs(build.root, build.cache)
    assert sorted(p.name for p in staging.iterdir()) == ["abc-live"]


@pytest.mark.skipif(os.geteuid() != 0, reason="a build user of its own needs root")
def test_an_inherited_uv_cache_dir_the_build_user_cannot_use_is_replaced_and_said_once(
    build, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """As root with UV_CACHE_DIR on root's own cache (a CI container's uv setup step), builds
    use leakbisect's own cache, and one warning says so; given any other way, it is refused."""
    private = build.root.parent / "root-only"
    private.mkdir(mode=0o700)
    monkeypatch.setenv("UV_CACHE_DIR", str(private / "uv"))
    own = build.root.parent / "uv"
    with caplog.at_level(logging.WARNING, logger="runners.envs"):
        assert envs.prepare_dirs(build.root, private / "uv") == (build.root, own)
        assert envs.prepare_dirs(build.root, private / "uv") == (build.root, own)
    ids = users.identities()
    assert [r.getMessage() for r in caplog.records] == [
        f"UV_CACHE_DIR {private / 'uv'} is not usable by the build user, {ids.build}; builds "
        f"use leakbisect's own uv cache {own} instead"
    ]
    monkeypatch.delenv("UV_CACHE_DIR")
    with pytest.raises(Unavailable, match="is not usable by"):
        envs.prepare_dirs(build.root, private / "uv")


@pytest.mark.skipif(os.geteuid() != 0, reason="every directory is reachable by its only user")
def test_an_unreachable_root_is_refused_in_one_line(build) -> None:
    private = build.root.parent / "private"
    private.mkdir(mode=0o700)
    ids = users.identities()
    with pytest.raises(Unavailable) as info:
        envs.prepare_dirs(private / "envs", build.cache)
    assert str(info.value) == (
        f"environment root {private / 'envs'} is not usable by {ids.trial}: "
        f"{users.describe(private)}; choose a directory every user can reach "
        "(BISECT_CACHE_DIR, UV_CACHE_DIR)"
    )
    with pytest.raises(Unavailable) as info:
        envs.prepare_dirs(build.root, private / "uv")
    assert str(info.value).startswith(f"uv cache {private / 'uv'} is not usable by {ids.build}: ")
