"""runners.safefs: each rule against what an untrusted user can leave in a directory.

Every refusal is checked by its message and by the file outside staying byte-identical
with its owner and mode. A FIFO must never block: those calls run in a thread joined
with a timeout, and the test asserts that the thread finished (not how fast).
"""

import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from runners import safefs
from tests.planted import fingerprint, finishes

CAP = 64


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A root-only file outside the directory under attack."""
    target = tmp_path / "outside" / "secret"
    target.parent.mkdir()
    target.write_bytes(b"root only\n")
    target.chmod(0o600)
    return target


@pytest.fixture
def box(tmp_path: Path) -> Iterator[tuple[Path, int]]:
    """The directory an untrusted user writes, and root's descriptor of it."""
    path = tmp_path / "box"
    path.mkdir()
    fd = safefs.open_dir(path)
    try:
        yield path, fd
    finally:
        os.close(fd)


def test_open_dir_refuses_a_link_and_a_file(box: tuple[Path, int], outside: Path) -> None:
    path, _ = box
    (path / "link").symlink_to(outside.parent)
    (path / "file").write_bytes(b"")
    for name in ("link", "file"):
        with pytest.raises(safefs.UnsafePath, match=f"^{path / name} is not a directory"):
            safefs.open_dir(path / name)


def test_read_file_reads_a_regular_file_and_none_when_absent(box: tuple[Path, int]) -> None:
    path, fd = box
    (path / "ok").write_bytes(b"{}")
    assert safefs.read_file(fd, "ok", CAP) == b"{}"
    assert safefs.read_file(fd, "missing", CAP) is None


def test_read_file_refuses_a_link_and_reads_nothing_through_it(
    box: tuple[Path, int], outside: Path
) -> None:
    path, fd = box
    (path / "p").symlink_to(outside)
    with pytest.raises(safefs.UnsafePath, match="^p is a symbolic link, not a regular file$"):
        safefs.read_file(fd, "p", CAP)


def test_read_file_never_blocks_on_a_fifo(box: tuple[Path, int]) -> None:
    path, fd = box
    os.mkfifo(path / "p")
    with pytest.raises(safefs.UnsafePath, match="^p is a FIFO, not a regular file$"):
        finishes(lambda: safefs.read_file(fd, "p", CAP))


def test_read_file_never_reads_dev_zero(box: tuple[Path, int]) -> None:
    path, fd = box
    (path / "p").symlink_to("/dev/zero")
    with pytest.raises(safefs.UnsafePath, match="^p is a symbolic link"):
        finishes(lambda: safefs.read_file(fd, "p", CAP))


@pytest.mark.skipif(os.geteuid() != 0, reason="making a device node needs root")
def test_read_file_refuses_a_device_node_without_opening_it(box: tuple[Path, int]) -> None:
    path, fd = box
    os.mknod(path / "p", 0o600 | stat.S_IFCHR, os.makedev(1, 5))  # /dev/zero's numbers
    with pytest.raises(safefs.UnsafePath, match="^p is a character device, not a regular"):
        finishes(lambda: safefs.read_file(fd, "p", CAP))


def test_read_file_refuses_a_hard_link_and_a_stranger_s_file(
    box: tuple[Path, int], outside: Path
) -> None:
    path, fd = box
    os.link(outside, path / "p")  # same file system: tmp_path
    with pytest.raises(safefs.UnsafePath, match="^p has 2 hard links; a file written here"):
        safefs.read_file(fd, "p", CAP)
    (path / "q").write_bytes(b"{}")
    with pytest.raises(safefs.UnsafePath, match=f"^q is owned by uid {os.geteuid()}, not 4242$"):
        safefs.read_file(fd, "q", CAP, uid=4242)


def test_read_file_is_bounded(box: tuple[Path, int]) -> None:
    path, fd = box
    (path / "p").write_bytes(b"x" * (CAP + 1))
    with pytest.raises(safefs.TooLarge, match=f"^p is {CAP + 1} bytes; at most {CAP}$") as e:
        safefs.read_file(fd, "p", CAP)
    assert e.value.size == CAP + 1
    (path / "q").write_bytes(b"x" * CAP)
    assert safefs.read_file(fd, "q", CAP) == b"x" * CAP


def test_read_file_refuses_names_that_leave_the_directory(box: tuple[Path, int]) -> None:
    _, fd = box
    for name in ("../box", "a/b", "..", ""):
        with pytest.raises(safefs.UnsafePath, match="is not a plain file name$"):
            safefs.read_file(fd, name, CAP)


def test_create_file_refuses_a_planted_link_fifo_or_file(
    box: tuple[Path, int], outside: Path
) -> None:
    path, fd = box
    before = fingerprint(outside)
    (path / "link").symlink_to(outside)
    (path / "dangling").symlink_to(outside.parent / "new")
    os.mkfifo(path / "fifo")
    for name in ("link", "dangling", "fifo"):
        with pytest.raises(safefs.UnsafePath, match=f"^{name} already exists"):
            finishes(lambda n=name: safefs.create_file(fd, n, b"data", uid=0, gid=0))
    assert fingerprint(outside) == before
    assert not (outside.parent / "new").exists()


def test_create_file_sets_owner_and_mode_on_the_descriptor(box: tuple[Path, int]) -> None:
    path, fd = box
    safefs.create_file(fd, "f", b"data", uid=os.geteuid(), gid=os.getegid(), mode=0o640)
    st = (path / "f").stat()
    assert (path / "f").read_bytes() == b"data"
    assert stat.S_IMODE(st.st_mode) == 0o640
    assert (st.st_uid, st.st_gid) == (os.geteuid(), os.getegid())


def test_replace_file_replaces_a_link_and_never_writes_through_it(
    box: tuple[Path, int], outside: Path
) -> None:
    path, fd = box
    before = fingerprint(outside)
    (path / "rec").symlink_to(outside)
    safefs.replace_file(fd, "rec", b"new", mode=0o644)
    assert not (path / "rec").is_symlink()
    assert (path / "rec").read_bytes() == b"new"
    assert stat.S_IMODE((path / "rec").stat().st_mode) == 0o644
    assert fingerprint(outside) == before
    assert sorted(p.name for p in path.iterdir()) == ["rec"]  # no temporary left


def test_make_dir_refuses_a_planted_link(box: tuple[Path, int], outside: Path) -> None:
    path, fd = box
    (path / "home").symlink_to(outside.parent)
    with pytest.raises(FileExistsError):
        safefs.make_dir(fd, "home")
    new = safefs.make_dir(fd, "tmp", mode=0o700)
    os.close(new)
    assert stat.S_IMODE((path / "tmp").stat().st_mode) == 0o700


def test_remove_tree_follows_no_link_and_changes_no_mode_outside(
    tmp_path: Path, outside: Path
) -> None:
    """Links to a file and to a directory outside, a FIFO, a tree made unreadable:
    all gone, and the outside file and directory keep their bytes, owner and mode."""
    top = tmp_path / "work"
    (top / "a" / "b").mkdir(parents=True)
    (top / "a" / "b" / "file").write_bytes(b"x")
    (top / "a" / "to-file").symlink_to(outside)
    (top / "a" / "b" / "to-dir").symlink_to(outside.parent)
    os.mkfifo(top / "fifo")
    (top / "a" / "b").chmod(0o000)
    (top / "a").chmod(0o500)
    before, dir_mode = fingerprint(outside), stat.S_IMODE(outside.parent.stat().st_mode)
    finishes(lambda: safefs.remove_tree(top))
    assert not top.exists()
    assert fingerprint(outside) == before
    assert stat.S_IMODE(outside.parent.stat().st_mode) == dir_mode


def test_remove_tree_of_a_link_removes_the_link_only(tmp_path: Path, outside: Path) -> None:
    (tmp_path / "work").symlink_to(outside.parent)
    before, dir_mode = fingerprint(outside), stat.S_IMODE(outside.parent.stat().st_mode)
    tmp_mode = stat.S_IMODE(tmp_path.stat().st_mode)
    safefs.remove_tree(tmp_path / "work")
    assert not (tmp_path / "work").is_symlink()
    assert fingerprint(outside) == before
    assert stat.S_IMODE(outside.parent.stat().st_mode) == dir_mode
    assert stat.S_IMODE(tmp_path.stat().st_mode) == tmp_mode


def test_remove_tree_with_a_held_descriptor_leaves_a_swapped_name(
    tmp_path: Path, outside: Path
) -> None:
    """The directory's owner renamed it and put a link at its name: the directory is
    emptied through the held descriptor; the link and what it names stay."""
    top = tmp_path / "work"
    top.mkdir()
    (top / "f").write_bytes(b"x")
    held = safefs.open_dir(top)
    try:
        top.rename(tmp_path / "moved")
        top.symlink_to(outside.parent)
        safefs.remove_tree(top, held=held)
    finally:
        os.close(held)
    assert list((tmp_path / "moved").iterdir()) == []
    assert top.is_symlink() and outside.exists()


def test_remove_tree_of_any_depth_holds_few_descriptors(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A script can nest directories deeper than the descriptor limit: deeper than
    MAX_DEPTH (8 here) they are moved up and removed from the top, all of them."""
    monkeypatch.setattr(safefs, "MAX_DEPTH", 8)
    top = tmp_path / "work"
    top.mkdir()
    fd = safefs.open_dir(top)
    for _ in range(100):
        new = safefs.make_dir(fd, "d")
        safefs.create_file(new, "f", b"x")
        os.close(fd)
        fd = new
    os.close(fd)
    opened = len(os.listdir("/proc/self/fd"))
    seen: list[int] = []
    real_open = safefs.open_dir

    def counting(*a: Any, **kw: Any) -> int:
        seen.append(len(os.listdir("/proc/self/fd")) - opened)
        return real_open(*a, **kw)

    monkeypatch.setattr(safefs, "open_dir", counting)
    safefs.remove_tree(top)
    assert not top.exists()
    assert max(seen) <= 8 + 2  # the levels held, the parent's and the listing's
