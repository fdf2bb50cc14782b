"""File handling where an untrusted user can change the path: the one place that does it.

The runner is root; a trial or build user can write the directories it works in (a
trial's work dir, an environment being built, a bind-mounted volume). Whatever name root
resolves there can be swapped between two system calls for a symlink to ``/etc/shadow``,
a FIFO that never answers, ``/dev/zero``, or a hard link to a root-only file. So root
never hands such a *path* to the kernel twice; it holds a descriptor and works from it.
The rules, in the order the code applies them:

1. **Directories are opened, not named** (`open_dir`, `dir_fd`, `make_dir`):
   ``O_DIRECTORY|O_NOFOLLOW``, and everything inside goes through ``dir_fd=``. Only the
   last component is protected: the path given to `open_dir` must lie under directories
   the untrusted user cannot change (``/tmp`` itself is sticky; a work dir root made).
2. **Files are created fresh** (`create_file`): ``O_CREAT|O_EXCL|O_NOFOLLOW``, so a name
   planted beforehand (a link, a FIFO, anything) makes the call fail instead of writing
   through it; ownership and mode are set with ``fchown``/``fchmod`` on the descriptor,
   never by name (``chown`` by name follows a link planted after the write).
3. **Files are replaced, not rewritten** (`replace_file`): a fresh ``O_EXCL`` temporary in
   the same directory, ``fsync``, then ``rename`` by directory descriptors (rename never
   follows a link at either name).
4. **Files are read only when they are what they claim** (`read_file`): the name is
   opened ``O_PATH|O_NOFOLLOW`` (opening nothing: no FIFO blocks, no device is touched),
   ``fstat`` must say a regular file with one link (a hard link to a root-only file has
   two) and, when asked, the expected owner; only then is that same inode reopened for
   reading (through ``/proc/self/fd``), with ``O_NONBLOCK``, and at most ``max_bytes + 1``
   bytes are read, so a file that grows past the cap is refused, not read without bound.
5. **Trees are removed without following anything** (`remove_tree`): a walk by
   descriptors (at most `MAX_DEPTH` held: deeper directories are moved up first, so a
   tree of any depth goes) that unlinks links and files and never ``chmod``s by name;
   a directory the untrusted code made unreadable (possible only when the runner is not
   root) is opened ``O_PATH|O_NOFOLLOW`` and made 0700 through its descriptor first.

Every refusal is `UnsafePath`, whose message is one line naming the file and why.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import stat
from collections.abc import Iterator
from pathlib import Path

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_PATH_FLAGS = os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC
_CREATE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
MAX_DEPTH = 64  # directory descriptors `remove_tree` holds at once
_KINDS = {
    stat.S_IFLNK: "a symbolic link",
    stat.S_IFIFO: "a FIFO",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
    stat.S_IFSOCK: "a socket",
    stat.S_IFDIR: "a directory",
}


class UnsafePath(OSError):
    """A file root refused to touch: its one-line message names it and says why."""


class TooLarge(UnsafePath):
    """A file over the read cap; ``size`` is its length (at least the cap plus one)."""

    def __init__(self, message: str, size: int) -> None:
        super().__init__(message)
        self.size = size


def _name(name: str) -> str:
    """A single path component: anything else would walk out of the directory."""
    if not name or name in (".", "..") or "/" in name or "\0" in name:
        raise UnsafePath(f"{name!r} is not a plain file name")
    return name


def kind_of(mode: int) -> str:
    """What a file is, in words ("a FIFO"), for refusals."""
    return _KINDS.get(stat.S_IFMT(mode), "not a regular file")


def open_dir(path: str | os.PathLike[str], *, dir_fd: int | None = None) -> int:
    """A descriptor of the directory `path`; `UnsafePath` when its last component is a
    symlink or not a directory."""
    try:
        return os.open(path, _DIR_FLAGS, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            raise UnsafePath(f"{path} is not a directory (a symbolic link or a file)") from exc
        raise


@contextlib.contextmanager
def dir_fd(path: str | os.PathLike[str], *, parent: int | None = None) -> Iterator[int]:
    """`open_dir` as a context manager that closes the descriptor."""
    fd = open_dir(path, dir_fd=parent)
    try:
        yield fd
    finally:
        os.close(fd)


def make_dir(
    parent: int, name: str, *, mode: int = 0o700, uid: int | None = None, gid: int | None = None
) -> int:
    """Create ``name`` in `parent` (it must not exist) and return its descriptor, with
    mode and owner set on the descriptor."""
    os.mkdir(_name(name), 0o700, dir_fd=parent)
    fd = open_dir(name, dir_fd=parent)
    try:
        set_owner(fd, uid, gid, mode)
    except BaseException:
        os.close(fd)
        raise
    return fd


def set_owner(fd: int, uid: int | None, gid: int | None, mode: int) -> None:
    """``fchown`` (when `uid` is given) then ``fchmod``: chown clears set-id bits, so the
    mode goes last."""
    if uid is not None:
        os.fchown(fd, uid, -1 if gid is None else gid)
    os.fchmod(fd, mode)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def create_file(
    parent: int,
    name: str,
    data: bytes,
    *,
    uid: int | None = None,
    gid: int | None = None,
    mode: int = 0o600,
) -> None:
    """Create ``name`` in `parent` holding `data`; `UnsafePath` when anything (a link, a
    FIFO, a file) is already there."""
    try:
        fd = os.open(_name(name), _CREATE_FLAGS, 0o600, dir_fd=parent)
    except FileExistsError as exc:
        raise UnsafePath(f"{name} already exists (something was planted there)") from exc
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise UnsafePath(f"{name} is a symbolic link") from exc
        raise
    try:
        set_owner(fd, uid, gid, mode)
        _write_all(fd, data)
    finally:
        os.close(fd)


def replace_file(
    parent: int,
    name: str,
    data: bytes,
    *,
    mode: int = 0o644,
    uid: int | None = None,
    gid: int | None = None,
) -> None:
    """Make ``name`` in `parent` hold `data`, atomically, whatever was at that name."""
    _name(name)
    while True:
        tmp = f".{name}.{secrets.token_hex(6)}.tmp"
        try:
            fd = os.open(tmp, _CREATE_FLAGS, 0o600, dir_fd=parent)
            break
        except FileExistsError:  # planted or a collision: another fresh name
            continue
    try:
        try:
            set_owner(fd, uid, gid, mode)
            _write_all(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, name, src_dir_fd=parent, dst_dir_fd=parent)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp, dir_fd=parent)
        raise


def read_file(parent: int, name: str, max_bytes: int, *, uid: int | None = None) -> bytes | None:
    """The bytes of the regular file ``name`` in `parent`, None when there is none.

    `UnsafePath` when it is anything else (a link, a FIFO, a device, a directory, a
    socket), has more than one link, or is not owned by `uid` (when given); `TooLarge`
    when it holds more than `max_bytes`.
    """
    try:
        pfd = os.open(_name(name), _PATH_FLAGS, dir_fd=parent)
    except FileNotFoundError:
        return None
    try:
        st = os.fstat(pfd)
        _check_regular(name, st, uid)
        if st.st_size > max_bytes:
            raise TooLarge(f"{name} is {st.st_size} bytes; at most {max_bytes}", st.st_size)
        fd = _reopen(pfd, st)
    finally:
        os.close(pfd)
    try:
        data = _read_upto(fd, max_bytes + 1)
    finally:
        os.close(fd)
    if len(data) > max_bytes:
        raise TooLarge(f"{name} is over {max_bytes} bytes", len(data))
    return data


def _check_regular(name: str, st: os.stat_result, uid: int | None) -> None:
    if not stat.S_ISREG(st.st_mode):
        raise UnsafePath(f"{name} is {kind_of(st.st_mode)}, not a regular file")
    if st.st_nlink != 1:
        raise UnsafePath(f"{name} has {st.st_nlink} hard links; a file written here has one")
    if uid is not None and st.st_uid != uid:
        raise UnsafePath(f"{name} is owned by uid {st.st_uid}, not {uid}")


def _reopen(pfd: int, st: os.stat_result) -> int:
    """The inode behind the ``O_PATH`` descriptor `pfd`, opened for reading: through
    /proc (no name lookup at all) where mounted, else the same name again, checked to be
    the same inode."""
    fd = os.open(f"/proc/self/fd/{pfd}", os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    again = os.fstat(fd)
    if (again.st_dev, again.st_ino) != (st.st_dev, st.st_ino):
        os.close(fd)
        raise UnsafePath("the file changed while it was opened")
    return fd


def _read_upto(fd: int, limit: int) -> bytes:
    chunks: list[bytes] = []
    left = limit
    while left > 0:
        chunk = os.read(fd, min(left, 1 << 20))
        if not chunk:
            break
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def read_path(
    path: str | os.PathLike[str], max_bytes: int, *, uid: int | None = None
) -> bytes | None:
    """`read_file` for ``path``: its directory is opened (not followed if a link) first."""
    path = Path(path)
    with dir_fd(path.parent) as parent:
        return read_file(parent, path.name, max_bytes, uid=uid)


# --------------------------------------------------------------------------- removal


def remove_tree(path: str | os.PathLike[str], *, held: int | None = None) -> None:
    """Remove `path` and everything under it without following a link anywhere; a link
    at `path` itself is removed, never what it points to. Missing is fine.

    `held`: a descriptor of the directory `path` named when it was made. It is emptied
    through that descriptor, and the name removed only while it still names that
    directory: its untrusted owner may have renamed it and put a link in its place.
    """
    path = Path(path)
    with dir_fd(path.parent) as parent:
        if held is None:
            remove_entry(parent, path.name)
            return
        _empty(held)
        try:
            now = os.lstat(path.name, dir_fd=parent)
        except FileNotFoundError:
            return
        was = os.fstat(held)
        if (now.st_dev, now.st_ino) == (was.st_dev, was.st_ino):
            _unlink(parent, path.name, dir=True)


def remove_entry(parent: int, name: str) -> None:
    """Remove ``name`` in `parent` (a file, a link or a whole tree) by descriptors."""
    try:
        st = os.lstat(_name(name), dir_fd=parent)
    except FileNotFoundError:
        return
    if not stat.S_ISDIR(st.st_mode):
        _unlink(parent, name, dir=False)
        return
    fd = _open_for_removal(parent, name)
    if fd is None:  # it became something else meanwhile: a name to unlink
        _unlink(parent, name, dir=False)
        return
    try:
        _empty(fd)
    finally:
        os.close(fd)
    _unlink(parent, name, dir=True)


def _empty(top: int) -> None:
    """Remove everything inside the directory `top`, iteratively (a deep tree does not
    exhaust Python's stack); one descriptor per level is held, at most `MAX_DEPTH`: a
    directory deeper than that is moved up into `top` and removed from there."""
    _usable(top)
    stack: list[tuple[int, str | None]] = [(top, None)]
    while stack:
        fd, _ = stack[-1]
        descended = False
        for name in os.listdir(fd):
            try:
                st = os.lstat(name, dir_fd=fd)
            except FileNotFoundError:
                continue
            if not stat.S_ISDIR(st.st_mode):
                _unlink(fd, name, dir=False)
                continue
            child = _open_for_removal(fd, name)
            if child is None:
                _unlink(fd, name, dir=False)
                continue
            _usable(child)
            if len(stack) >= MAX_DEPTH:  # hoist the subtree into `top`: fds stay bounded
                os.close(child)
                os.rename(name, f".rm-{secrets.token_hex(8)}", src_dir_fd=fd, dst_dir_fd=top)
                continue
            stack.append((child, name))
            descended = True
            break
        if descended:
            continue
        fd, name = stack.pop()
        if name is not None:
            os.close(fd)
            _unlink(stack[-1][0], name, dir=True)


def _usable(fd: int) -> None:
    """Let this directory's owner list and change it (a non-root runner removing what
    a script made 0500 or 0000), through the descriptor."""
    mode = os.fstat(fd).st_mode
    if mode & 0o700 != 0o700:
        with contextlib.suppress(OSError):
            os.fchmod(fd, 0o700)


def _open_for_removal(parent: int, name: str) -> int | None:
    """The directory ``name`` opened for listing, made 0700 through an ``O_PATH``
    descriptor when its mode keeps its owner out; None when it is not a directory."""
    try:
        return open_dir(name, dir_fd=parent)
    except UnsafePath:
        return None
    except PermissionError:
        pass
    try:
        pfd = os.open(name, _PATH_FLAGS | os.O_DIRECTORY, dir_fd=parent)
    except NotADirectoryError:
        return None
    try:
        os.chmod(f"/proc/self/fd/{pfd}", 0o700)  # the inode held, not a name
    finally:
        os.close(pfd)
    try:
        return open_dir(name, dir_fd=parent)
    except UnsafePath:
        return None


def _unlink(parent: int, name: str, *, dir: bool, again: bool = True) -> None:
    try:
        if dir:
            os.rmdir(name, dir_fd=parent)
        else:
            os.unlink(name, dir_fd=parent)
    except FileNotFoundError:
        return
    except PermissionError:  # the directory was made read-only: its owner may fix that
        if not again:
            raise
        os.fchmod(parent, 0o700)
        _unlink(parent, name, dir=dir, again=False)
