"""runners.commits and service.example.gitrepo, on real git repositories (and one real uv build)."""

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from uv import find_uv_bin

from contract.sources import repo_from_urls, source_ref
from contract.wire import CommitRange, EnvSpec, TrialSpec
from runners.commits import (
    URL_PROTOCOLS,
    Commit,
    CommitsError,
    _git_env,
    answer,
    checkout_for,
    list_commits,
    list_range,
    report,
    tag_candidates,
    tag_for,
)
from runners.trial import LocalExecutor
from runners.users import identities
from service.example.githttp import serve_smart
from service.example.gitrepo import (
    BROKEN_SUBJECT,
    FIX_SUBJECT,
    LEAK_SUBJECT,
    _git,
    build_repo,
)
from tests.gitfixture import bare_copy

SUBJECTS = [
    "docs: explain the noise knobs",
    "step(): build the churn list with a comprehension",
    "tests: cover the cache fill",
    BROKEN_SUBJECT,
    FIX_SUBJECT,
    "refactor: name the spike phases",
    LEAK_SUBJECT,
    "docs: fix a typo in the module docstring",
    "style: sort the module constants",
    "ci: run on Python 3.12",
    "chore: bump the copyright year",
    "release 1.0.6",
]


@pytest.fixture(scope="module")
def fixture_repo(tmp_path_factory):
    return build_repo(tmp_path_factory.mktemp("git") / "leakyfixture")


def show(repo: Path, sha: str, path: str) -> str:
    return _git(repo, "show", f"{sha}:{path}")


def test_build_repo_layout(fixture_repo):
    f = fixture_repo
    assert f.tags == ("v1.0.5", "v1.0.6")
    assert [subject for _, subject in f.commits] == SUBJECTS
    assert f.leaking_sha == f.commits[6][0]
    assert f.broken_sha == f.commits[3][0]
    assert _git(f.path, "rev-parse", "v1.0.6^{commit}") == f.commits[-1][0]
    assert _git(f.path, "log", "--format=%s", "v1.0.5") == "release 1.0.5\ninitial import"
    assert "LEAKS = False" in show(f.path, "v1.0.5", "leakyfixture/__init__.py")
    assert "LEAKS = False" in show(f.path, f.commits[5][0], "leakyfixture/__init__.py")
    assert "LEAKS = True" in show(f.path, f.leaking_sha, "leakyfixture/__init__.py")
    assert "LEAKS = True" in show(f.path, "v1.0.6", "leakyfixture/__init__.py")
    assert show(f.path, f.commits[4][0], "leakyfixture/VERSION") == "1.0.6.dev5"
    with pytest.raises(RuntimeError, match="exists on disk, but not in"):
        show(f.path, f.broken_sha, "leakyfixture/VERSION")


def test_build_repo_is_deterministic(fixture_repo, tmp_path):
    again = build_repo(tmp_path / "again")
    assert again.commits == fixture_repo.commits
    assert (again.leaking_sha, again.broken_sha) == (
        fixture_repo.leaking_sha,
        fixture_repo.broken_sha,
    )
    assert _git(again.path, "rev-parse", "v1.0.5") == _git(fixture_repo.path, "rev-parse", "v1.0.5")


def test_build_repo_other_shapes(tmp_path):
    f = build_repo(tmp_path / "r", commits=3, leaking=3, broken=None)
    assert [s for _, s in f.commits] == [
        "docs: explain the noise knobs",
        "step(): build the churn list with a comprehension",
        LEAK_SUBJECT,
    ]
    assert (f.leaking_sha, f.broken_sha) == (f.commits[2][0], None)
    assert "LEAKS = False" in show(f.path, f.commits[1][0], "leakyfixture/__init__.py")
    assert "LEAKS = True" in show(f.path, "v1.0.6", "leakyfixture/__init__.py")
    with pytest.raises(ValueError, match="need 1 <= broken < commits and broken != leaking"):
        build_repo(tmp_path / "bad", commits=4, leaking=2, broken=4)


def test_commits_build_offline_with_uv(fixture_repo, tmp_path):
    """The in-tree backend builds each commit with uv and no index; the broken one fails.
    (Its own uv cache: uv runs as this process's user here, and the session's cache belongs
    to the build user the runners drop to; root-owned entries in it break later builds.)"""
    venv = tmp_path / "venv"
    env = {"VIRTUAL_ENV": str(venv), "PATH": "/usr/bin:/bin", "UV_CACHE_DIR": str(tmp_path / "uv")}

    def uv(*args: str) -> subprocess.CompletedProcess[str]:
        cmd = [find_uv_bin(), *args]
        return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)

    assert uv("venv", "--quiet", "--python", sys.executable, str(venv)).returncode == 0
    repo = str(fixture_repo.path)
    old = _git(fixture_repo.path, "rev-parse", "v1.0.5")
    probe = "import leakyfixture as m; print(m.__version__, m.LEAKS)"
    for sha, expected in ((old, "1.0.5 False"), (fixture_repo.leaking_sha, "1.0.6.dev7 True")):
        done = uv("pip", "install", "--no-index", f"leakyfixture @ {source_ref(repo, sha)}")
        assert done.returncode == 0, done.stderr
        out = subprocess.run([venv / "bin" / "python", "-c", probe], capture_output=True, text=True)
        assert out.stdout == expected + "\n"
    broken = uv(
        "pip",
        "install",
        "--no-index",
        f"leakyfixture @ {source_ref(repo, fixture_repo.broken_sha)}",
    )
    assert broken.returncode == 1
    assert "No such file or directory: 'leakyfixture/VERSION'" in broken.stderr


def test_tag_for(fixture_repo, tmp_path):
    repo = build_repo(tmp_path / "tags", commits=2, leaking=2, broken=None).path
    _git(repo, "tag", "leakyfixture-1.0.7", "v1.0.5")
    _git(repo, "tag", "leakyfixture@2.0.0rc1", "v1.0.5")
    assert tag_for(repo, "leakyfixture", "1.0.6") == "v1.0.6"
    assert tag_for(repo, "leakyfixture", "1.0.7") == "leakyfixture-1.0.7"
    assert tag_for(repo, "leakyfixture", "2.0.0-rc1") == "leakyfixture@2.0.0rc1"
    assert tag_for(repo, "leakyfixture", "1.0.06") == "v1.0.6"
    assert tag_candidates("pkg", "1.0") == ["v1.0", "1.0", "pkg-1.0", "pkg-v1.0", "pkg@1.0"]
    with pytest.raises(CommitsError) as e:
        tag_for(repo, "leakyfixture", "1.0.8")
    assert str(e.value) == (
        f"no tag for leakyfixture 1.0.8 in {repo}: tried v1.0.8, 1.0.8, leakyfixture-1.0.8, "
        "leakyfixture-v1.0.8, leakyfixture@1.0.8"
    )


def test_list_commits(fixture_repo):
    commits = list_commits(fixture_repo.path, "v1.0.5", "v1.0.6")
    assert commits == [Commit(sha, subject) for sha, subject in fixture_repo.commits]
    assert len(commits) == 12
    with pytest.raises(CommitsError) as e:
        list_commits(fixture_repo.path, "v1.0.6", "v1.0.5")
    assert str(e.value) == f"v1.0.6 is not an ancestor of v1.0.5 in {fixture_repo.path}"
    with pytest.raises(CommitsError) as e:
        list_commits(fixture_repo.path, "v1.0.5", "v9")
    assert str(e.value) == f"v9 is not a commit in {fixture_repo.path}"
    with pytest.raises(CommitsError) as e:
        list_commits(fixture_repo.path, "v1.0.6", "v1.0.6")
    assert str(e.value) == f"no commits between v1.0.6 and v1.0.6 in {fixture_repo.path}"


def test_list_commits_follows_first_parent(tmp_path):
    repo = build_repo(tmp_path / "merge", commits=2, leaking=2, broken=None).path
    _git(repo, "checkout", "--quiet", "-b", "side")
    for n in (1, 2):
        (repo / f"side{n}.txt").write_text(f"{n}\n")
        _git(repo, "add", "--all")
        _git(repo, "commit", "--quiet", "-m", f"side {n}", date=1706800000 + n)
    _git(repo, "checkout", "--quiet", "main")
    _git(repo, "merge", "--quiet", "--no-ff", "-m", "Merge branch 'side'", "side", date=1706900000)
    _git(repo, "tag", "v1.0.7")
    merge = _git(repo, "rev-parse", "HEAD")
    assert list_commits(repo, "v1.0.6", "v1.0.7") == [Commit(merge, "Merge branch 'side'")]


def test_checkout_for_url_clones_and_fetches(reachable_tmp: Path) -> None:
    """A URL is cloned bare and blob-less (smart HTTP), into a clone of the user git runs
    as; a later listing fetches into the same clone."""
    origin = build_repo(reachable_tmp / "origin", commits=2, leaking=2, broken=None)
    served = bare_copy(origin.path, reachable_tmp / "served" / "origin.git")
    cache = reachable_tmp / "cache"
    build = identities().build
    with serve_smart(served.parent) as base:
        url = f"{base}/origin.git"
        with checkout_for(url, cache) as clone:
            assert clone.parent == cache and len(clone.name) == 16
            assert clone.stat().st_uid == (build.uid if build else os.getuid())
            assert "\tpartialclonefilter = blob:none\n" in (clone / "config").read_text()
            assert [(c.sha, c.subject) for c in list_commits(clone, "v1.0.5", "v1.0.6")] == (
                list(origin.commits)
            )
        assert sorted(p.name for p in cache.iterdir() if p.is_dir()) == [clone.name]
        # Present: fetched again, so a new tag upstream shows up.
        (origin.path / "NEWS").write_text("1.0.7\n")
        _git(origin.path, "add", "--all")
        _git(origin.path, "commit", "--quiet", "-m", "release 1.0.7", date=1706900000)
        _git(origin.path, "tag", "v1.0.7")
        _git(origin.path, "push", "--quiet", str(served), "main", "v1.0.7")
        with checkout_for(url, cache) as again:
            assert again == clone
            assert tag_for(clone, "leakyfixture", "1.0.7") == "v1.0.7"
            assert list_commits(clone, "v1.0.6", "v1.0.7") == [
                Commit(_git(origin.path, "rev-parse", "HEAD"), "release 1.0.7")
            ]


def test_checkout_for_paths(fixture_repo, tmp_path):
    """A path, or a file:// URL (`bisect-cli run` only), is the user's own clone: used as it
    is, never copied into the cache."""
    for local in (str(fixture_repo.path), fixture_repo.path.as_uri()):
        with checkout_for(local, tmp_path / "cache") as where:
            assert where == fixture_repo.path.resolve()
    for not_repo in (tmp_path, fixture_repo.path / "leakyfixture", tmp_path / "missing"):
        with pytest.raises(CommitsError) as e, checkout_for(str(not_repo), tmp_path / "cache"):
            pass
        assert str(e.value) == f"repo {not_repo} is not a git repository"
    missing = (tmp_path / "nowhere").as_uri()
    with pytest.raises(CommitsError) as e, checkout_for(missing, tmp_path / "cache"):
        pass
    assert str(e.value) == f"repo {missing} is not a git repository"
    assert not (tmp_path / "cache").exists()


def test_checkout_for_times_out_with_one_line(reachable_tmp: Path) -> None:
    """A server that accepts and never answers: the clone ends at the timeout, nothing left."""
    cache = reachable_tmp / "cache"
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        url = f"git://127.0.0.1:{server.getsockname()[1]}/r.git"
        with pytest.raises(CommitsError) as e, checkout_for(url, cache, timeout=1):
            pass
    assert str(e.value) == "git clone timed out after 1 s"
    assert [p for p in cache.iterdir() if p.is_dir()] == []


def test_source_ref():
    sha = "5e6f57eecff9e798e08b1a32b8ee34000c2343ec"
    assert source_ref("https://github.com/o/r", sha) == f"git+https://github.com/o/r@{sha}"
    assert source_ref("git+https://gitlab.com/g/s/r.git", sha) == (
        f"git+https://gitlab.com/g/s/r.git@{sha}"
    )
    assert source_ref("git@github.com:o/r.git", sha) == f"git+ssh://git@github.com/o/r.git@{sha}"
    assert source_ref("/srv/clones/r", sha) == f"git+file:///srv/clones/r@{sha}"


def test_repo_from_urls():
    assert repo_from_urls(
        {"Homepage": "https://example.org", "Source": "https://github.com/o/r"}
    ) == ("https://github.com/o/r")
    assert repo_from_urls({"source code": "https://github.com/o/r/tree/main/sub/"}) == (
        "https://github.com/o/r"
    )
    assert repo_from_urls({"Repository": "https://gitlab.com/g/sub/r/-/tree/main"}) == (
        "https://gitlab.com/g/sub/r"
    )
    assert repo_from_urls({"Code": "https://codeberg.org/o/r/src/branch/main"}) == (
        "https://codeberg.org/o/r"
    )
    assert repo_from_urls({"Source_Code": "https://git.example.org/r.git"}) == (
        "https://git.example.org/r.git"
    )
    # Homepage only counts when it is a repository; the docs site is not.
    assert repo_from_urls({"Homepage": "https://www.github.com/o/r#readme"}) == (
        "https://www.github.com/o/r"
    )
    assert (
        repo_from_urls({"Homepage": "https://r.readthedocs.io", "Docs": "https://github.com/o/r"})
        is None
    )
    assert repo_from_urls({"Source": "https://github.com/o"}) is None
    assert repo_from_urls({}) is None


RANGE = {"package": "leakyfixture", "good": "1.0.5", "bad": "1.0.6"}


def test_a_commits_trial_lists_the_range_over_http(fixture_repo, reachable_tmp: Path) -> None:
    """What a runner does for a commits trial (the local executor): clone over smart http,
    as a forge serves it, then the good tag's commit and the 12 after it; a later trial
    fetches into the same cached clone."""
    tagged = _git(fixture_repo.path, "rev-parse", "v1.0.5^{commit}")
    executor = LocalExecutor(reachable_tmp / "envs", reachable_tmp / "cache")
    bare_copy(fixture_repo.path, reachable_tmp / "served" / "leakyfixture.git")
    with serve_smart(reachable_tmp / "served") as base:
        url = f"{base}/leakyfixture.git"
        spec = TrialSpec(
            trial_id=7,
            kind="commits",
            env=EnvSpec(package="leakyfixture", version="1.0.6"),
            script="",
            commit_range=CommitRange(repo=url, **RANGE),
        )
        report = executor.run_trial(spec)
        again = executor.run_trial(spec)
    assert (report.trial_id, report.env.ok, report.env.error) == (7, True, None)
    assert [(c.sha, c.subject) for c in report.commits] == [
        (tagged, "release 1.0.5"), *fixture_repo.commits
    ]  # fmt: skip
    assert again.commits == report.commits
    assert len([p for p in (reachable_tmp / "cache" / "git").iterdir() if p.is_dir()]) == 1
    assert (report.samples, report.exit_code) == ([], None)  # nothing ran


def test_a_commits_trial_says_why_it_lists_nothing(fixture_repo, tmp_path) -> None:
    path = str(fixture_repo.path)
    missing = answer(CommitRange(repo=path, **{**RANGE, "bad": "1.0.9"}), tmp_path)
    assert set(missing) == {"error", "seconds"}
    assert missing["error"] == (
        f"no tag for leakyfixture 1.0.9 in {path}: tried v1.0.9, 1.0.9, leakyfixture-1.0.9, "
        "leakyfixture-v1.0.9, leakyfixture@1.0.9"
    )
    spec = TrialSpec(trial_id=3, attempt=2, kind="commits", script="",
                     env=EnvSpec(package="leakyfixture", version="1.0.6"))  # fmt: skip
    failed = report(spec, missing)
    assert (failed.trial_id, failed.attempt, failed.commits) == (3, 2, None)
    assert (failed.env.ok, failed.env.error) == (False, missing["error"])
    assert answer(None, tmp_path)["error"] == "a commits trial needs its commit_range"
    # git's ext:: transport runs a command: never a repository, not even a path.
    pwned = tmp_path / "pwned"
    hostile = answer(CommitRange(repo=f"ext::sh -c touch% {pwned}", **RANGE), tmp_path)
    assert hostile["error"] == f"repo ext::sh -c touch% {pwned} is not a git repository"
    assert not pwned.exists()


def test_list_range_caps_the_commits(fixture_repo, tmp_path, monkeypatch) -> None:
    monkeypatch.setattr("runners.commits.MAX_COMMITS", 5)
    with pytest.raises(CommitsError) as e:
        list_range(str(fixture_repo.path), "leakyfixture", "1.0.5", "1.0.6", tmp_path)
    assert str(e.value) == (
        "12 commits between v1.0.5 and v1.0.6; at most 4 can be bisected (bisect releases "
        "closer together)"
    )


def test_git_sees_no_secret_and_no_user_config(monkeypatch) -> None:
    """A clone runs git with a clean environment: no BISECT_* token, no config of the
    runner's user, no prompt, and only the protocols the repository's kind allows."""
    monkeypatch.setenv("BISECT_TOKEN", "secret")
    monkeypatch.setenv("SSL_CERT_FILE", "/etc/ca.pem")
    monkeypatch.setenv("GIT_DIR", "/elsewhere")
    monkeypatch.delenv("GIT_SSL_CAINFO", raising=False)
    env = _git_env(URL_PROTOCOLS)
    assert not [k for k in env if k.startswith("BISECT_") or k == "GIT_DIR"]
    assert env["GIT_ALLOW_PROTOCOL"] == "https:http:git:ssh"
    assert (env["GIT_SSL_CAINFO"], env["GIT_CONFIG_NOSYSTEM"]) == ("/etc/ca.pem", "1")
    assert env["GIT_TERMINAL_PROMPT"] == "0"
