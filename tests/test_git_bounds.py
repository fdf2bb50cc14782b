"""A commits listing is bounded like a trial (issue 24, row 5), against servers on loopback.

A slow server: the clone ends at its deadline or at the low-speed limit, in one line, and
no process of it (git, git-remote-http) is left, nor a zombie after several. A large
repository: over git's dumb HTTP it is refused before its packs are sent; from a smart
server that sends every blob it is stopped at the fetch cap; a smart server that filters
blobs lists it at a fraction of its size. The clone cache evicts the least recently used
clone over its budget, never one in use, and clones unused for too long.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from contract.wire import CommitRange
from runners import commits, gitcache
from runners.commits import answer
from runners.gitrun import tree_bytes
from runners.users import identities
from service.example.githttp import serve_smart
from tests.gitfixture import (
    bare_copy,
    large_repo,
    make_repo,
    processes_with,
    serve_slow,
    serve_static,
)

REPO_ROOT = Path(__file__).resolve().parents[1]
DUMB_REFUSED = (
    "git clone refused: the server speaks only git's dumb HTTP protocol, which cannot "
    "leave out file contents; a commits listing needs smart HTTP (git http-backend, any forge)"
)


def listing(url: str, good: str = "1.0", bad: str = "2.0") -> CommitRange:
    return CommitRange(repo=url, package="big", good=good, bad=bad)


def clones(cache: Path) -> list[str]:
    """The clones in the cache (their keys), not the lock files."""
    return sorted(p.name for p in cache.iterdir() if p.is_dir()) if cache.exists() else []


def children() -> set[str]:
    """This process's descendants: the worker may hold others' (servers of session
    fixtures, earlier tests'), so a test compares what is there after with before."""
    return {f"{p.pid} {p.name()}" for p in psutil.Process().children(recursive=True)}


@pytest.fixture(scope="module")
def big(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory served over HTTP holding ``big.git``: 12 MiB of random blobs."""
    root = tmp_path_factory.mktemp("big-served")
    large_repo(root / "big.git", megabytes=12)
    return root


def test_a_slow_server_is_cut_at_the_deadline_and_nothing_outlives_it(
    reachable_tmp: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before: git's http helper, orphaned by the timeout, read the trickle for as long as
    the server sent it (21 minutes on the runner). Now the supervisor kills the tree."""
    monkeypatch.setattr(commits, "CLONE_TIMEOUT", 1.5)
    monkeypatch.setattr(commits, "LOW_SPEED_S", 60)  # the deadline, not the speed, ends it
    before = children()
    with serve_slow() as url:
        found = answer(listing(url), reachable_tmp / "git")
        left = processes_with(url.rsplit("/", 1)[0])
    assert found["error"] == "git clone timed out after 1.5 s"
    assert left == []
    assert children() - before == set()
    assert os.listdir(reachable_tmp / "git") == []


def test_the_whole_listing_has_a_deadline(
    reachable_tmp: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(commits, "LIST_DEADLINE_S", 1.0)
    monkeypatch.setattr(commits, "LOW_SPEED_S", 60)
    with serve_slow() as url:
        found = answer(listing(url), reachable_tmp / "git")
        left = processes_with(url.rsplit("/", 1)[0])
    assert found["error"] == ("git clone stopped: listing the commits took longer than 1 s")
    assert left == []


def test_a_trickle_below_the_low_speed_limit_ends_the_clone(
    reachable_tmp: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """20 bytes a second against a floor of 1000 for 1 s: curl gives up long before the
    clone's 30 s deadline."""
    monkeypatch.setattr(commits, "CLONE_TIMEOUT", 30.0)
    monkeypatch.setattr(commits, "LOW_SPEED_S", 1)
    with serve_slow() as url:
        found = answer(listing(url), reachable_tmp / "git")
    # curl's own words after git's; not "timed out": the speed floor ended it.
    assert found["error"].startswith(f"git clone failed: unable to access '{url}/': ")
    assert "Operation too slow. Less than 1000 bytes/sec" in found["error"]


_REAPER = """
import ctypes, json, os, sys
from pathlib import Path
ctypes.CDLL(None).prctl(36, 1, 0, 0, 0)  # a child subreaper, as a runner that is PID 1
from runners import commits
from contract.wire import CommitRange
commits.CLONE_TIMEOUT = 0.5
commits.LOW_SPEED_S = 60
url, cache = sys.argv[1], Path(sys.argv[2])
errors = [commits.answer(CommitRange(repo=url, package="p", good="1", bad="2"), cache)["error"]
          for _ in range(3)]
kids = [int(k) for t in os.listdir("/proc/self/task")
        for k in open(f"/proc/self/task/{t}/children").read().split()]
print(json.dumps({"errors": errors, "children": kids}))
"""


def test_timed_out_listings_leave_no_zombie_and_no_child(reachable_tmp: Path) -> None:
    """Before: each timeout orphaned git's http helper to the runner (a subreaper, or PID
    1 in a container), which never reaped it: zombies piled up. Now there is none."""
    with serve_slow() as url:
        proc = subprocess.run(
            [sys.executable, "-c", _REAPER, url, str(reachable_tmp / "git")],
            cwd=REPO_ROOT, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out == {"errors": ["git clone timed out after 0.5 s"] * 3, "children": []}


def test_a_dumb_server_is_refused_before_it_sends_the_repository(
    big: Path, reachable_tmp: Path
) -> None:
    """Before: the blob filter needs smart HTTP, so all 12 MiB were cloned (and kept)."""
    cache = reachable_tmp / "git"
    with serve_static(big) as (base, server):
        found = answer(listing(f"{base}/big.git"), cache)
        sent = server.sent
    assert found["error"] == DUMB_REFUSED
    assert sent < 64 << 10  # info/refs only, no pack
    assert clones(cache) == []
    assert os.listdir(cache) == []  # no clone, no lock file left


def test_a_server_that_sends_every_blob_is_stopped_at_the_cap(
    big: Path, reachable_tmp: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A smart server that does not filter blobs (git http-backend's default) sends the
    whole repository: the clone stops at `MAX_FETCH_BYTES` and nothing of it stays."""
    monkeypatch.setattr(commits, "MAX_FETCH_BYTES", 2 << 20)
    cache = reachable_tmp / "git"
    before = children()
    with serve_smart(big, filters=False) as base:
        found = answer(listing(f"{base}/big.git"), cache)
    assert found["error"] == (
        "git clone stopped: the repository sent more than 2 MiB, the most a commits listing fetches"
    )
    assert clones(cache) == []
    assert os.listdir(cache) == []  # no clone, no lock file left
    assert children() - before == set()


def test_a_smart_server_that_filters_blobs_lists_a_large_repository(
    big: Path, reachable_tmp: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(commits, "MAX_FETCH_BYTES", 2 << 20)
    cache = reachable_tmp / "git"
    with serve_smart(big) as base:
        found = answer(listing(f"{base}/big.git"), cache)
    assert [c["subject"] for c in found["commits"]] == ["large files", "release 2.0"]
    [key] = clones(cache)
    assert not (cache / key / "shallow").exists()
    assert tree_bytes(cache / key) < 256 << 10  # commits and trees, no blob


def _small_repos(root: Path, names: list[str]) -> None:
    work = make_repo(root / "work", "small")
    work.commit("x = 1\n")
    work.git("tag", "v1.0")
    work.commit("x = 2\n")
    work.git("tag", "v2.0")
    for name in names:
        bare_copy(work.path, root / "served" / f"{name}.git")


def test_the_cache_evicts_the_least_recently_used_clone(
    reachable_tmp: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before: a clone was kept for ever per URL. Now: over `MAX_BYTES` the least recently
    used goes, one in use never does, and one unused for `MAX_AGE_S` goes too."""
    _small_repos(reachable_tmp, ["r1", "r2", "r3"])
    cache = reachable_tmp / "git"
    with serve_smart(reachable_tmp / "served") as base:
        url = {n: f"{base}/{n}.git" for n in ("r1", "r2", "r3")}
        key = {n: gitcache.key_of(u) for n, u in url.items()}
        for name in ("r1", "r2", "r1"):  # r1 used last
            assert "commits" in answer(listing(url[name]), cache)
        size = {n: int((cache / f"{key[n]}.lock").read_text()) for n in ("r1", "r2")}
        assert 0 < size["r2"] <= size["r1"]  # r1 was fetched into again
        # One byte short of r1 and two clones as r2 (r3 is the same repository): listing
        # r3 puts the cache over, and r2, the least recently used, goes.
        monkeypatch.setattr(gitcache, "MAX_BYTES", size["r1"] + 2 * size["r2"] - 1)
        assert "commits" in answer(listing(url["r3"]), cache)
        assert clones(cache) == sorted([key["r1"], key["r3"]])
        # In use (locked by a listing) it stays, even with no budget at all.
        monkeypatch.setattr(gitcache, "MAX_BYTES", 0)
        with gitcache.use(cache, url["r1"], identities().build):
            fd = os.open(cache, os.O_RDONLY | os.O_DIRECTORY)
            try:
                gone = gitcache.evict(fd)
            finally:
                os.close(fd)
        assert gone == [key["r3"]]
        assert clones(cache) == []  # r1 went on its own release: over the budget too
    assert sorted(os.listdir(cache)) == [".evict.lock"]


def test_a_clone_unused_for_too_long_is_evicted(
    reachable_tmp: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _small_repos(reachable_tmp, ["old", "new"])
    cache = reachable_tmp / "git"
    with serve_smart(reachable_tmp / "served") as base:
        assert "commits" in answer(listing(f"{base}/old.git"), cache)
        old = cache / f"{gitcache.key_of(f'{base}/old.git')}.lock"
        os.utime(old, (0, 1_000_000_000))  # last used in 2001
        assert "commits" in answer(listing(f"{base}/new.git"), cache)
    assert clones(cache) == [gitcache.key_of(f"{base}/new.git")]
