"""The offline fixture and its index, and service.index over real HTTP on 127.0.0.1."""

import base64
import csv
import hashlib
import io
import json
import os
import shutil
import socket
import ssl
import subprocess
import sys
import zipfile
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest
from packaging import tags as ptags
from packaging.version import Version
from uv import find_uv_bin

from engine.releases import select_range
from service.example.fixture import FixtureSpec, build_fixture, write_wheel
from service.example.index import JSON_TYPE, negotiate, serve_index
from service.index import IndexUnavailable, _ssl_verify, list_releases, target_tags

ALL = ["1.0.0", "1.0.1", "1.0.2", "1.0.3", "1.0.4", "1.0.5", "1.0.6", "1.0.7", "1.0.8", "1.0.9"]
REPRO = Path(__file__).resolve().parents[1] / "service" / "example" / "repro.py"


def day(n: int) -> datetime:
    return datetime(2024, 1, 1 + n, tzinfo=UTC)


@pytest.fixture(scope="module")
def wheel_dir(tmp_path_factory) -> Path:
    return build_fixture(tmp_path_factory.mktemp("wheels"))


@pytest.fixture(scope="module")
def index_url(wheel_dir):
    with serve_index(wheel_dir) as url:
        yield url


@pytest.fixture
def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# --- the fixture ---------------------------------------------------------------------------


def test_fixture_defaults():
    spec = FixtureSpec()
    assert spec.all_versions() == [*ALL, "1.1.0rc1"]
    assert [v for v in spec.all_versions() if spec.leaks(v)] == [
        "1.0.6",
        "1.0.7",
        "1.0.8",
        "1.0.9",
        "1.1.0rc1",
    ]
    assert dict(spec.yanked) == {"1.0.3": "broken metadata"}
    with pytest.raises(TypeError):
        spec.yanked["1.0.1"] = "x"  # read-only
    hash(spec)
    assert FixtureSpec(yanked={"1.0.3": "broken metadata"}) == spec


def test_wheels_are_valid(wheel_dir):
    names = sorted(p.name for p in wheel_dir.glob("*.whl"))
    assert "leakyfixture-1.0.4-cp311-cp311-win_amd64.whl" in names
    assert "leakyfixture-1.1.0rc1-py3-none-any.whl" in names
    assert len(names) == 11
    with zipfile.ZipFile(wheel_dir / "leakyfixture-1.0.6-py3-none-any.whl") as zf:
        record = zf.read("leakyfixture-1.0.6.dist-info/RECORD").decode()
        for path, digest, size in csv.reader(io.StringIO(record)):
            if path.endswith("RECORD"):
                continue
            data = zf.read(path)
            expect = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
            assert digest == "sha256=" + expect.decode() and int(size) == len(data)
        metadata = zf.read("leakyfixture-1.0.6.dist-info/METADATA").decode()
        assert "Version: 1.0.6\n" in metadata and "Requires-Python: >=3.8\n" in metadata
    meta = json.loads((wheel_dir / "index.json").read_text())["files"]
    assert meta["leakyfixture-1.0.3-py3-none-any.whl"]["yanked"] == "broken metadata"
    assert meta["leakyfixture-1.0.6-py3-none-any.whl"]["upload_time"] == (
        "2024-01-07T00:00:00.000000Z"
    )


# --- the served index ----------------------------------------------------------------------


def test_negotiate():
    assert negotiate(None) == "text/html"
    assert negotiate("text/html") == "text/html"
    assert negotiate(f"{JSON_TYPE}, text/html;q=0.1") == JSON_TYPE
    assert negotiate(f"{JSON_TYPE};q=0.2, text/html") == "text/html"
    assert negotiate(f"{JSON_TYPE};q=0, */*") == "text/html"
    assert negotiate("*/*") == "text/html"
    assert negotiate(f"{JSON_TYPE}, */*;q=0.5") == JSON_TYPE
    assert negotiate("application/*") == JSON_TYPE
    # What uv and pip send.
    uv_accept = f"{JSON_TYPE}, application/vnd.pypi.simple.v1+html;q=0.2, text/html;q=0.01"
    assert negotiate(uv_accept) == JSON_TYPE
    assert negotiate("application/vnd.pypi.simple.v1+html") == "application/vnd.pypi.simple.v1+html"
    assert negotiate(f"{JSON_TYPE};q=0") == "text/html"


def test_served_pages(index_url):
    root = httpx.get(index_url + "/", headers={"Accept": JSON_TYPE})
    assert root.json()["projects"] == [{"name": "leakyfixture"}]
    page = httpx.get(index_url + "/LeakyFixture", follow_redirects=True)
    assert str(page.url) == index_url + "/leakyfixture/"
    assert page.headers["content-type"] == "text/html"
    assert 'data-yanked="broken metadata">leakyfixture-1.0.3-py3-none-any.whl' in page.text
    assert 'data-requires-python="&gt;=3.8"' in page.text
    assert httpx.get(index_url + "/nopkg/").status_code == 404


# --- list_releases -------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", ["json", "html", None])
def test_list_releases(index_url, fmt):
    releases = list_releases("LeakyFixture", index_url=index_url, force_format=fmt)
    assert [str(r.version) for r in releases] == [*ALL, "1.1.0rc1"]
    by = {str(r.version): r for r in releases}
    assert by["1.0.3"].yanked and by["1.0.3"].yanked_reason == "broken metadata"
    assert not any(r.yanked for v, r in by.items() if v != "1.0.3")
    f = by["1.0.2"].files[0]
    assert f.url == index_url.removesuffix("/simple") + "/files/" + f.filename
    assert f.requires_python == ">=3.8"
    assert f.sha256 == hashlib.sha256(httpx.get(f.url).content).hexdigest()
    if fmt == "html":  # PEP 503 HTML carries no upload time
        assert all(r.upload_time is None for r in releases)
    else:
        assert [r.upload_time for r in releases] == [day(i) for i in range(11)]


def test_range_over_served_index(index_url):
    releases = list_releases("leakyfixture", index_url=index_url)
    python, tags = target_tags(None)
    cands = select_range(
        releases,
        "1.0.2",
        "1.0.9",
        pre=False,
        skip_yanked=False,
        package="leakyfixture",
        python_version=python,
        platform_tags=tags,
    )
    assert [c.version for c in cands] == ALL[2:]
    assert [(c.version, c.untestable_reason) for c in cands if not c.testable] == [
        (
            "1.0.4",
            f"no wheel for Python {python} on this platform and no sdist"
            " (wheels: cp311-cp311-win_amd64)",
        )
    ]
    assert [c.version for c in cands if c.yanked] == ["1.0.3"]
    with_pre = select_range(releases, "1.0.8", "1.1.0rc1", pre=False, skip_yanked=True)
    assert [c.version for c in with_pre] == ["1.0.8", "1.0.9", "1.1.0rc1"]
    no_yanked = select_range(releases, "1.0.2", "1.0.5", pre=False, skip_yanked=True)
    assert [c.version for c in no_yanked] == ["1.0.2", "1.0.4", "1.0.5"]


def test_find_links_directory(wheel_dir, tmp_path):
    releases = list_releases("leakyfixture", index_url=None, find_links=[wheel_dir])
    assert [str(r.version) for r in releases] == [*ALL, "1.1.0rc1"]
    assert all(r.upload_time is None and not r.yanked for r in releases)
    assert releases[0].files[0].url == (wheel_dir / releases[0].files[0].filename).as_uri()
    # A location holding other files too; as a file:// URL.
    shutil.copy(wheel_dir / "leakyfixture-1.0.0-py3-none-any.whl", tmp_path)
    (tmp_path / "other-1.0-py3-none-any.whl").write_bytes(b"")
    (tmp_path / "notes.txt").write_text("")
    releases = list_releases("leakyfixture", index_url=None, find_links=[tmp_path.as_uri()])
    assert [str(r.version) for r in releases] == ["1.0.0"]


def test_index_and_find_links_merge(index_url, tmp_path):
    write_wheel(tmp_path, FixtureSpec(versions=("1.0.10",)), "1.0.10")
    releases = list_releases("leakyfixture", index_url=index_url, find_links=[str(tmp_path)])
    assert [str(r.version) for r in releases][-3:] == ["1.0.9", "1.0.10", "1.1.0rc1"]


def test_extra_index_when_primary_lacks_package(index_url, tmp_path):
    with serve_index(tmp_path) as empty:
        releases = list_releases("leakyfixture", index_url=empty, extra_index_urls=[index_url])
        assert len(releases) == 11
        with pytest.raises(IndexUnavailable) as err:
            list_releases("leakyfixture", index_url=empty)
        assert str(err.value) == f"package 'leakyfixture' not found on {empty} (404)"


def test_unknown_package(index_url):
    with pytest.raises(IndexUnavailable) as err:
        list_releases("nopkg", index_url=index_url + "/")
    assert str(err.value) == f"package 'nopkg' not found on {index_url} (404)"


def test_unreachable_index(closed_port):
    url = f"http://127.0.0.1:{closed_port}/simple"
    with pytest.raises(IndexUnavailable) as err:
        list_releases("leakyfixture", index_url=url, timeout=5)
    assert str(err.value) == f"cannot reach index {url}: connection refused"


def test_missing_find_links(tmp_path):
    with pytest.raises(IndexUnavailable) as err:
        list_releases("leakyfixture", index_url=None, find_links=[tmp_path / "nope"])
    assert str(err.value) == f"find-links location {tmp_path / 'nope'} does not exist"


def test_ssl_cert_file_is_used(monkeypatch, tmp_path):
    import certifi

    monkeypatch.delenv("SSL_CERT_DIR", raising=False)
    monkeypatch.setenv("SSL_CERT_FILE", certifi.where())
    assert isinstance(_ssl_verify(), ssl.SSLContext)
    monkeypatch.setenv("SSL_CERT_FILE", str(tmp_path / "missing.pem"))
    assert _ssl_verify() is True


# --- target tags ---------------------------------------------------------------------------


def test_target_tags():
    running = sys.version_info
    version, tags = target_tags(None)
    assert version == f"{running.major}.{running.minor}.{running.micro}"
    assert tags == list(ptags.sys_tags())
    version, tags = target_tags(f"cpython@{running.major}.{running.minor}")
    assert version == f"{running.major}.{running.minor}" and tags == list(ptags.sys_tags())
    version, tags = target_tags("3.99")
    assert version == "3.99"
    strs = [str(t) for t in tags]
    assert strs[0].startswith("cp399-cp399-") and "py3-none-any" in strs
    own = f"cp{running.major}{running.minor}"
    assert f"{own}-abi3-" in " ".join(strs) and f"{own}-{own}-" not in " ".join(strs)
    with pytest.raises(ValueError, match="cannot tell the Python version of 'pypy'"):
        target_tags("pypy")


# --- uv installs from the served index, and the leak is real -------------------------------

RSS_PROBE = """
import leakyfixture
def rss_mib():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
for i in range(40):
    leakyfixture.step()
    if i + 1 == 10:
        warm = rss_mib()
print(leakyfixture.__version__, rss_mib() - warm)
"""


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads RSS from /proc")
def test_uv_installs_and_leak_is_real(index_url, tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("UV_", "PIP_", "VIRTUAL_ENV"))}
    uv = [find_uv_bin()]
    venv = tmp_path / "venv"
    subprocess.run([*uv, "venv", "-q", "--python", sys.executable, str(venv)], check=True, env=env)
    python = venv / "bin" / "python"

    def install(version: str) -> subprocess.CompletedProcess:
        cmd = [
            *uv,
            "pip",
            "install",
            "-q",
            "--python",
            str(python),
            "--cache-dir",
            str(tmp_path / "cache"),
            "--index-url",
            index_url,
            f"leakyfixture=={version}",
        ]
        return subprocess.run(cmd, env=env, capture_output=True, text=True)

    growth = {}
    for version in ("1.0.2", "1.0.6"):
        assert install(version).returncode == 0
        out = subprocess.run([python, "-c", RSS_PROBE], capture_output=True, text=True, check=True)
        got, mib = out.stdout.split()
        assert got == version
        growth[version] = float(mib)
    assert growth["1.0.2"] < 8, growth  # bounded noise only
    assert growth["1.0.6"] > 24, growth  # 30 steps x 1 MiB after the warm-up

    # The foreign-only release cannot be installed here.
    failed = install("1.0.4")
    assert failed.returncode != 0 and "win_amd64" in failed.stderr

    # The bundled repro prints one step marker per step.
    run = subprocess.run([python, str(REPRO)], capture_output=True, text=True, check=True)
    assert run.stdout.splitlines() == ["::leakbisect-step::"] * 40
    assert Version(
        subprocess.run(
            [python, "-c", "import leakyfixture; print(leakyfixture.__version__)"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    ) == Version("1.0.6")
