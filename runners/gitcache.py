"""The clone cache of commits listings: one bare clone per repository URL, locked while in
use, evicted least recently used first.

Layout of the cache root (``cache_dir/git``: made by the runner, mode 0711, never reached
through a link, refused in one line when it is not a directory of the runner's own):

- ``<key>/``: the clone of one URL (key: the first 16 hex digits of its sha256). It is
  owned by the user git runs as (the build user when the runner is root), who alone
  writes it; the runner never runs git in it as itself, it only measures and removes it;
- ``<key>.lock``: the runner's (0600). A listing holds an exclusive ``flock`` on it from
  the fetch to the last read (`use`), so a clone in use is never fetched into twice nor
  evicted. Its mtime is the clone's last use, its content the clone's size in bytes
  after that use (what eviction adds up, without walking every clone);
- ``<key>.new/``: a clone being made (owned by the git user); renamed to ``<key>`` when
  complete, removed when found with its lock free (a listing that was killed). A listing
  that made no clone removes its lock file: a failing URL leaves nothing behind.

Eviction, after every use (under ``.evict.lock``, so two listings do not race): a clone
unused for `MAX_AGE_S` (14 days) goes; then, least recently used first, clones go until
the recorded sizes add up to at most `MAX_BYTES` (4 GiB). A clone whose lock is held (in
use by another listing, or the caller's own) is skipped. The cap on one fetch
(`runners.commits.MAX_FETCH_BYTES`) keeps one clone well under the budget.

A clone found owned by someone other than the git user (the layout of older versions,
whose clones were the runner's) is removed and made again.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import shutil
import stat
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from runners.gitrun import tree_bytes
from runners.users import Identity

MAX_BYTES = 4 << 30
MAX_AGE_S = 14 * 24 * 3600.0
ROOT_MODE = 0o711  # the git user reaches its clone by name; nobody else lists or writes
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class CacheError(Exception):
    """A one-line reason the cache cannot be used."""


def key_of(url: str) -> str:
    return hashlib.sha256(url.encode()).hexdigest()[:16]


def _open_root(root: Path) -> int:
    """The cache root's descriptor: a directory of the runner's own, not a link."""
    root.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileExistsError):
        os.mkdir(root, ROOT_MODE)
    try:
        fd = os.open(root, _DIR)
    except OSError as e:
        raise CacheError(f"git cache {root} is not a directory: {e.strerror}") from None
    st = os.fstat(fd)
    if st.st_uid != os.geteuid() or st.st_mode & 0o022:
        os.close(fd)
        raise CacheError(
            f"git cache {root} is not the runner's own (owner uid {st.st_uid}, mode "
            f"{stat.S_IMODE(st.st_mode):04o}): remove it"
        )
    if stat.S_IMODE(st.st_mode) != ROOT_MODE:
        os.fchmod(fd, ROOT_MODE)
    return fd


def _remove(dirfd: int, name: str) -> None:
    """Remove `name` under `dirfd`, a tree or a file, never following a link."""
    try:
        st = os.stat(name, dir_fd=dirfd, follow_symlinks=False)
    except FileNotFoundError:
        return
    if stat.S_ISDIR(st.st_mode):
        shutil.rmtree(name, dir_fd=dirfd, ignore_errors=True)
    else:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(name, dir_fd=dirfd)


def _owner(dirfd: int, name: str) -> int | None:
    try:
        st = os.stat(name, dir_fd=dirfd, follow_symlinks=False)
    except FileNotFoundError:
        return None
    return st.st_uid if stat.S_ISDIR(st.st_mode) else -1


def _lock(dirfd: int, name: str, *, wait: bool) -> int | None:
    """An exclusive flock on `name` (created 0600 when missing); None when busy.

    Retries when the file was removed (evicted) between the open and the lock, so a
    lock is only ever held on the file the name points at.
    """
    while True:
        fd = os.open(name, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600,
                     dir_fd=dirfd)  # fmt: skip
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            os.close(fd)
            return None
        try:
            same = os.stat(name, dir_fd=dirfd, follow_symlinks=False).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            same = False
        if same:
            return fd
        os.close(fd)


@dataclass
class Slot:
    """One URL's place in the cache, held (locked) by the caller."""

    root: Path
    key: str
    owner: Identity | None
    dirfd: int

    @property
    def path(self) -> Path:
        return self.root / self.key

    @property
    def new(self) -> Path:
        return self.root / f"{self.key}.new"

    @property
    def ready(self) -> bool:
        return _owner(self.dirfd, self.key) is not None

    def fresh(self) -> Path:
        """An empty directory for a new clone, owned by the git user."""
        _remove(self.dirfd, self.new.name)
        os.mkdir(self.new.name, 0o700, dir_fd=self.dirfd)
        if self.owner is not None:
            os.chown(self.new.name, self.owner.uid, self.owner.gid, dir_fd=self.dirfd,
                     follow_symlinks=False)  # fmt: skip
        return self.new

    def promote(self) -> None:
        """The new clone is complete: it becomes the clone."""
        os.rename(self.new.name, self.key, src_dir_fd=self.dirfd, dst_dir_fd=self.dirfd)


def _prepare(dirfd: int, key: str, owner: Identity | None) -> None:
    """With the lock held: drop a killed listing's half clone and a clone of another owner."""
    _remove(dirfd, f"{key}.new")
    want = owner.uid if owner is not None else os.geteuid()
    found = _owner(dirfd, key)
    if found is not None and found != want:
        _remove(dirfd, key)


def _record(dirfd: int, key: str, lock_fd: int) -> None:
    """The clone's size into its lock file, and now as its last use."""
    size = tree_bytes(Path(f"/proc/self/fd/{dirfd}") / key)
    os.ftruncate(lock_fd, 0)
    os.pwrite(lock_fd, str(size).encode(), 0)
    os.utime(lock_fd)


@contextmanager
def use(cache_root: Path, url: str, owner: Identity | None) -> Iterator[Slot]:
    """Hold `url`'s clone for the block (waiting while another listing holds it); record
    its size and last use afterwards, then evict what is over the budget."""
    dirfd = _open_root(Path(cache_root))
    key = key_of(url)
    try:
        lock_fd = _lock(dirfd, f"{key}.lock", wait=True)
        assert lock_fd is not None
        try:
            _prepare(dirfd, key, owner)
            yield Slot(Path(cache_root), key, owner, dirfd)
        finally:
            _remove(dirfd, f"{key}.new")  # a clone that failed
            if _owner(dirfd, key) is None:  # none made: nothing to remember
                os.unlink(f"{key}.lock", dir_fd=dirfd)
            else:
                _record(dirfd, key, lock_fd)
            os.close(lock_fd)  # releases the flock
        evict(dirfd)
    finally:
        os.close(dirfd)


@dataclass(frozen=True)
class _Entry:
    key: str
    used: float  # the lock file's mtime
    size: int


def _entries(dirfd: int) -> list[_Entry]:
    out = []
    for name in os.listdir(dirfd):
        if not name.endswith(".lock") or name.startswith("."):
            continue
        try:
            st = os.stat(name, dir_fd=dirfd, follow_symlinks=False)
            fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dirfd)
        except OSError:
            continue
        try:
            text = os.read(fd, 32).decode(errors="replace").strip()
        finally:
            os.close(fd)
        size = int(text) if text.isdigit() else 0
        out.append(_Entry(name.removesuffix(".lock"), st.st_mtime, size))
    return sorted(out, key=lambda e: e.used)


def _drop(dirfd: int, entry: _Entry) -> bool:
    """Remove one clone unless it is in use; whether it went."""
    fd = _lock(dirfd, f"{entry.key}.lock", wait=False)
    if fd is None:
        return False
    try:
        _remove(dirfd, entry.key)
        _remove(dirfd, f"{entry.key}.new")
        os.unlink(f"{entry.key}.lock", dir_fd=dirfd)
    finally:
        os.close(fd)
    return True


def evict(dirfd: int, *, now: float | None = None) -> list[str]:
    """Clones unused for `MAX_AGE_S`, then the least recently used while over `MAX_BYTES`;
    never one in use. Returns the keys removed."""
    evict_fd = _lock(dirfd, ".evict.lock", wait=True)
    assert evict_fd is not None
    try:
        for name in os.listdir(dirfd):
            if ".partial-" in name:  # a half clone of an older version, which had no lock
                _remove(dirfd, name)
        entries = _entries(dirfd)
        now = time.time() if now is None else now
        total = sum(e.size for e in entries)
        gone = []
        for e in entries:  # oldest first
            if now - e.used <= MAX_AGE_S and total <= MAX_BYTES:
                continue
            if _drop(dirfd, e):
                total -= e.size
                gone.append(e.key)
        return gone
    finally:
        os.close(evict_fd)
