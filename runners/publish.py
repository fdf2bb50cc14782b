"""Publishing environments: built in private, taken over by the runner, verified on reuse.

A build backend is the job's code (docs/security.md). These are the rules that keep what
it builds from reaching anything but its own environment:

* **Directories** (`runner_dir`): the environment root and the uv cache root belong to the
  runner (root: owned by root, 0755 / 0711), never to the build user, so the build user
  can plant nothing in them. A directory an older runner left owned by the build user is
  taken over (its top only: what is inside is not trusted and never reused); one owned
  by anybody else is refused in one line.
* **Owners** (`owner_key`): environments live under ``<env root>/<owner key>/<spec hash>``
  and each owner's builds write only ``<cache root>/<owner key>/uv``, so nothing built
  from one owner's cache is handed to another. The key is a hash of the owner, never the
  raw string (``local`` for a run without one, `bisect-cli run`). As root the owner's
  cache sits in a root-owned directory that is 0700 (closed to the build user) except
  while that owner's build holds the host's build lock (`open_cache`), and builds run one
  at a time (the build user is one uid: two owners' builds at once could reach each
  other's cache and staging through ``/proc``).
* **Staging** (`staging_dir`): a build happens in ``<env root>/.staging/<hash>-<random>``
  (0700, the build user's; ``.staging`` is root-owned 0711, so no build lists another's).
* **Take-over** (`take_over`): once every uv command of the build has returned (the
  supervisor, `runners.supervise`, kills the command's whole tree before it reports, and
  no process can leave a child subreaper's tree), the runner walks the tree top-down
  through directory descriptors without following a link: each directory is re-owned
  and made read-only *before* its entries are listed, each regular file is opened
  ``O_NOFOLLOW``, checked with ``fstat`` and changed with ``fchown``/``fchmod``; write,
  set-uid, set-gid and sticky bits are removed. An entry the build user does not own (a
  hard link to someone else's file) or that is not a file, directory or link fails the
  publish. Not root: the same walk without re-owning (one uid: nothing to protect
  against; write bits still go, so the trial's bytecode never changes the fingerprint).
* **Digest** (`digest`, `fingerprint`): at publish the record keeps a sha256 over every
  entry's relative path, type, mode and content (a link's target), and a stat
  fingerprint: path, type, mode, owner, size, inode, mtime and ctime of every entry but
  the top directory and the record. Reuse compares the fingerprint (one ``lstat`` per
  file). It is sound because a file's ctime cannot be set: any write, chmod, chown,
  rename or replacement sets it to the current time (or brings a new inode), and only
  root can move the clock; and no user but root can write a published tree at all.
* **Writing** (`create_file`, `read_record`: `runners.safefs`): the record and the
  constraint/name files kept beside an environment are created by the runner, after the
  take-over, through a directory descriptor with ``O_CREAT|O_EXCL|O_NOFOLLOW``: a name the
  build planted there fails the publish instead of being written through. The record is
  read back only as a regular, single-link file of the runner's in a directory of the
  runner's that no one else can write, and at most `MAX_RECORD_BYTES`.
* **Leftovers** (`clear_stale`): staging directories of builds that died with their
  runner are removed at the next start, by descriptors.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import secrets
import stat
import time
from collections.abc import Iterator
from pathlib import Path

from contract.errors import Unavailable
from runners import safefs
from runners.users import Identity, require_reachable

try:  # POSIX
    import fcntl
except ImportError:  # pragma: no cover
    fcntl = None  # type: ignore[assignment]

STAGING = ".staging"
LOCKS = ".locks"
LOCAL_OWNER = "local"
UNREACHABLE_FIX = "choose a directory every user can reach (BISECT_CACHE_DIR, UV_CACHE_DIR)"
# A record is a few KiB per hundred packages; anything bigger was not written by us.
MAX_RECORD_BYTES = 16 * 1024 * 1024
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC


class PublishError(Exception):
    """A staged tree that cannot be published (an entry the build did not create)."""


def is_root() -> bool:
    return os.geteuid() == 0


def owner_key(owner: str | None) -> str:
    """The directory name of an owner's environments and cache: a hash, never the name."""
    if owner is None:
        return LOCAL_OWNER
    return "o-" + hashlib.sha256(f"owner:{owner}".encode()).hexdigest()[:20]


# --------------------------------------------------------------------------- directories


def runner_dir(path: Path, readers: list[Identity], what: str, legacy: Identity | None,
               mode: int = 0o755) -> Path:  # fmt: skip
    """`path` as a directory of the runner's, `readers` can traverse; fail in one line.

    Created when missing (parents 0755). As root: owned by root with `mode`; one owned
    by `legacy` (the build user, from an older runner) is taken over, top only; one
    owned by any other user is refused.
    """
    path = Path(path)
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o755)
        with contextlib.suppress(FileExistsError):
            path.mkdir(mode=mode)
    if is_root():
        _own(path, legacy, what, mode)
    for reader in readers:
        require_reachable(path, reader, "x", what, UNREACHABLE_FIX)
    return path


def _own(path: Path, legacy: Identity | None, what: str, mode: int) -> None:
    fd = os.open(path, _DIR_FLAGS)  # a link here is refused (ELOOP), never followed
    try:
        st = os.fstat(fd)
        if st.st_uid not in (0, *([legacy.uid] if legacy else [])):
            raise Unavailable(
                f"{what} {path} is owned by uid {st.st_uid}: it must be root's, the runner "
                f"writes it; run: chown root: {path} && chmod {mode:04o} {path}"
            )
        os.fchown(fd, 0, 0)
        os.fchmod(fd, mode)
    finally:
        os.close(fd)


def child_dir(parent: Path, name: str, mode: int, owner: Identity | None = None) -> Path:
    """``parent/name`` made by the runner (as root: root's unless `owner`), with `mode`.

    As root, an existing entry that is not a directory of root's (or `owner`'s) is
    removed first: only the build user of an older runner, which owned the environment
    root and the cache, could have put it there, and nothing in it is trusted.
    """
    want = owner.uid if owner is not None else os.geteuid()
    fd = os.open(parent, _DIR_FLAGS)
    try:
        with contextlib.suppress(FileNotFoundError):
            st = os.stat(name, dir_fd=fd, follow_symlinks=False)
            if is_root() and not (stat.S_ISDIR(st.st_mode) and st.st_uid in (want, 0)):
                safefs.remove_entry(fd, name)  # by descriptors, following nothing
        with contextlib.suppress(FileExistsError):
            os.mkdir(name, mode, dir_fd=fd)
        sub = os.open(name, _DIR_FLAGS, dir_fd=fd)
    finally:
        os.close(fd)
    try:
        if is_root():
            os.fchown(sub, want, owner.gid if owner is not None else 0)
        os.fchmod(sub, mode)
    finally:
        os.close(sub)
    return parent / name


@contextlib.contextmanager
def locked(directory: Path, name: str) -> Iterator[None]:
    """An exclusive lock on ``directory/name`` (a runner-only directory), across processes."""
    fd = os.open(directory / name, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        if fcntl is not None:
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


@contextlib.contextmanager
def open_cache(cache_root: Path, key: str, build: Identity | None) -> Iterator[Path]:
    """The owner's uv cache, ``<cache root>/<key>/uv``, reachable by the build user only
    while the caller holds the build lock (see the module docstring)."""
    if build is None:
        wrapper = child_dir(cache_root, key, 0o755)
        yield child_dir(wrapper, "uv", 0o755)
        return
    wrapper = child_dir(cache_root, key, 0o700)
    cache = child_dir(wrapper, "uv", 0o700, build)
    os.chmod(wrapper, 0o711)
    try:
        yield cache
    finally:
        os.chmod(wrapper, 0o700)


def staging_dir(env_root: Path, name: str, build: Identity | None) -> Path:
    """A fresh private build directory under ``<env root>/.staging`` (see the docstring)."""
    top = child_dir(env_root, STAGING, 0o711 if build is not None else 0o700)
    return child_dir(top, f"{name}-{secrets.token_hex(8)}", 0o700, build)


def clear_stale(env_root: Path, older_than_s: float) -> None:
    """Remove staging directories of builds that died with their runner (by descriptors)."""
    try:
        fd = safefs.open_dir(env_root / STAGING)
    except OSError:
        return
    try:
        for name in os.listdir(fd):
            with contextlib.suppress(OSError):
                st = os.stat(name, dir_fd=fd, follow_symlinks=False)
                if time.time() - st.st_mtime > older_than_s:
                    safefs.remove_entry(fd, name)
    finally:
        os.close(fd)


# --------------------------------------------------------------------------- the walk


def _walk(fd: int, rel: str, prepare: bool, build_uid: int | None
          ) -> Iterator[tuple[str, int, str, os.stat_result]]:  # fmt: skip
    """(relative path, parent fd, name, lstat) of every entry under the directory `fd`,
    sorted; with `prepare`, each directory is taken over before it is listed."""
    for name in sorted(os.listdir(fd)):
        st = os.stat(name, dir_fd=fd, follow_symlinks=False)
        path = f"{rel}{name}"
        if stat.S_ISDIR(st.st_mode):
            sub = os.open(name, _DIR_FLAGS, dir_fd=fd)
            try:
                st = os.fstat(sub)
                if prepare:
                    st = _seize(sub, st, path, build_uid, 0o555)
                yield path, fd, name, st
                yield from _walk(sub, path + "/", prepare, build_uid)
            finally:
                os.close(sub)
        elif stat.S_ISREG(st.st_mode):
            if prepare:
                file_fd = os.open(name, _FILE_FLAGS, dir_fd=fd)
                try:
                    mode = (os.fstat(file_fd).st_mode & 0o555) | 0o444
                    st = _seize(file_fd, os.fstat(file_fd), path, build_uid, mode)
                finally:
                    os.close(file_fd)
            yield path, fd, name, st
        elif stat.S_ISLNK(st.st_mode):
            if prepare and build_uid is not None:
                _check_uid(st, path, build_uid)
                os.chown(name, 0, 0, dir_fd=fd, follow_symlinks=False)
                st = os.stat(name, dir_fd=fd, follow_symlinks=False)
            yield path, fd, name, st
        else:
            raise PublishError(f"{path} is not a file, directory or link")


def _check_uid(st: os.stat_result, path: str, build_uid: int) -> None:
    if st.st_uid != build_uid:
        raise PublishError(f"{path} is owned by uid {st.st_uid}, not the build's")


def _seize(fd: int, st: os.stat_result, path: str, build_uid: int | None, mode: int
           ) -> os.stat_result:  # fmt: skip
    """Root's, read-only (as root), on the descriptor; the stat afterwards."""
    if build_uid is not None:
        if st.st_uid != 0:  # a directory seized before (the top) is root's already
            _check_uid(st, path, build_uid)
        os.fchown(fd, 0, 0)
    os.fchmod(fd, mode)
    return os.fstat(fd)


def seize_dir(path: Path) -> None:
    """`path` (a directory, not a link) the runner's and 0700: nobody else can enter it."""
    fd = os.open(path, _DIR_FLAGS)
    try:
        if is_root():
            os.fchown(fd, 0, 0)
        os.fchmod(fd, 0o700)
    finally:
        os.close(fd)


def take_over(top: Path, build: Identity | None) -> None:
    """Make the staged tree `top` the runner's and read-only (see the module docstring)."""
    fd = os.open(top, _DIR_FLAGS)
    try:
        _seize(fd, os.fstat(fd), ".", build.uid if build else None, 0o755)
        for _ in _walk(fd, "", True, build.uid if build else None):
            pass
    finally:
        os.close(fd)


def seal(top: Path) -> None:
    """The top directory of a taken-over tree read-only too (after the record is in)."""
    fd = os.open(top, _DIR_FLAGS)
    try:
        os.fchmod(fd, 0o555)
    finally:
        os.close(fd)


def _kind(st: os.stat_result) -> str:
    return "d" if stat.S_ISDIR(st.st_mode) else "l" if stat.S_ISLNK(st.st_mode) else "f"


def fingerprint(top: Path, skip: tuple[str, ...] = ()) -> str:
    """sha256 over every entry's path, type, mode, owner, size, inode, mtime and ctime.

    Not root, inode and ctime are left out: environments are hard-linked from the uv
    cache there, and linking a cached file into a new environment changes its ctime.
    """
    h = hashlib.sha256()
    fd = os.open(top, _DIR_FLAGS)
    try:
        for path, _, _, st in _walk(fd, "", False, None):
            if path in skip:
                continue
            fields: tuple = (path, _kind(st), st.st_mode, st.st_uid, st.st_size, st.st_mtime_ns)
            if is_root():
                fields += (st.st_gid, st.st_ino, st.st_ctime_ns)
            h.update(repr(fields).encode() + b"\n")
    finally:
        os.close(fd)
    return h.hexdigest()


def digest(top: Path, skip: tuple[str, ...] = ()) -> str:
    """sha256 over every entry's path, type, mode and content (a link: its target)."""
    h = hashlib.sha256()
    fd = os.open(top, _DIR_FLAGS)
    try:
        for path, parent, name, st in _walk(fd, "", False, None):
            if path in skip:
                continue
            h.update(repr((path, _kind(st), stat.S_IMODE(st.st_mode))).encode() + b"\n")
            if stat.S_ISLNK(st.st_mode):
                h.update(os.readlink(name, dir_fd=parent).encode(errors="surrogateescape"))
            elif stat.S_ISREG(st.st_mode):
                _hash_file(h, parent, name)
    finally:
        os.close(fd)
    return h.hexdigest()


def _hash_file(h: hashlib._Hash, parent: int, name: str) -> None:
    fd = os.open(name, _FILE_FLAGS, dir_fd=parent)
    try:
        while chunk := os.read(fd, 1 << 20):
            h.update(chunk)
    finally:
        os.close(fd)


# --------------------------------------------------------------------------- files


def create_file(directory: Path, name: str, data: bytes, mode: int = 0o644) -> None:
    """Create ``directory/name`` (never an existing name, never through a link)."""
    with safefs.dir_fd(directory) as fd:
        safefs.create_file(fd, name, data, mode=mode)


def replace_file(directory: Path, name: str, data: bytes, mode: int = 0o644) -> None:
    """Write ``directory/name`` whole: a fresh temp name, then a rename."""
    with safefs.dir_fd(directory) as fd:
        safefs.replace_file(fd, name, data, mode=mode)


def read_record(directory: Path, name: str) -> bytes | None:
    """``directory/name`` when the directory is the runner's alone and the name a regular
    file of the runner's (bounded); else None."""
    try:
        with safefs.dir_fd(directory) as fd:
            st = os.fstat(fd)
            if st.st_uid != os.geteuid() or st.st_mode & 0o022:
                return None  # not a tree the runner published
            return safefs.read_file(fd, name, MAX_RECORD_BYTES, uid=os.geteuid())
    except OSError:  # missing, a link, not a regular file, too large (safefs.UnsafePath)
        return None
