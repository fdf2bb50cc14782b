"""Issue 24 rows 1b and 4: root never follows a path a trial can change.

Each site where the runner (root) writes, reads, chowns or removes something in a trial's
directory, attacked as the trial would: a symlink to a file outside (which must keep its
bytes, owner and mode), a FIFO (the call must return: it runs in a thread joined with a
timeout and the test asserts it finished) and ``/dev/zero`` (the read must be bounded).
The attacker acts as the trial user (a forked child that drops to its uid) wherever the
runner is root; the tests that need that skip, with the reason, when it is not.
"""

import contextlib
import io
import os
import tarfile
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from contract.wire import EnvSpec, TrialSpec
from runners import safefs, sandbox, tracing, trial
from runners.docker.executor import _profile
from runners.users import lease_trial_user
from tests.planted import fingerprint, finishes

ROOT = os.geteuid() == 0
needs_root = pytest.mark.skipif(not ROOT, reason="the attacker is the trial user: needs root")
PROFILE = tracing.PROFILE_NAME
SECRET = b'{"secret": "root only"}'


def as_user(uid: int, gid: int, action: Callable[[], None]) -> None:
    """Run `action` in a forked child as `uid`:`gid` (the trial user attacking)."""
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 1
        try:
            os.setgroups([])
            os.setgid(gid)
            os.setuid(uid)
            action()
            code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, "the attacker's plant failed"


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A root-only file (valid JSON) in a 0755 directory outside any trial's."""
    target = tmp_path / "etc" / "secret.json"
    target.parent.mkdir()
    target.parent.chmod(0o755)
    target.write_bytes(SECRET)
    target.chmod(0o600)
    return target


@pytest.fixture
def temp_root(reachable_tmp: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The system temp dir for the test: sticky and world-writable like /tmp, and
    reachable by the trial user; work dirs are made here (never chmod-able /tmp itself)."""
    root = reachable_tmp / "tmp"
    root.mkdir()
    root.chmod(0o1777)
    monkeypatch.setattr(tempfile, "tempdir", str(root))
    return root


def attribute_spec(script: str) -> TrialSpec:
    return TrialSpec(
        trial_id=24,
        kind="attribute",
        trace="tracemalloc",
        env=EnvSpec(package="unused", version="1.0", index_url="http://127.0.0.1:9/simple"),
        script=script,
        timeout_s=60,
        memory_limit_bytes=512 * 2**20,
    )


# ------------------------------------------------------- row 1b: the work dir's files


class Planter:
    """After root hands a trial's work dir to the trial user (chown by name or fchown on
    its descriptor), the trial user at once puts links to `outside` at the names root
    writes there: the race the issue won 3 times in 5, made certain."""

    NAMES = ("repro.py", tracing.HELPER_NAME)

    def __init__(self, outside: Path) -> None:
        self.outside = outside
        self.at_hand_over: list[str] | None = None

    def handed(self, path: str, uid: int, gid: int) -> None:
        p = Path(path)
        if uid in (0, -1) or not p.name.startswith("leakbisect-trial-") or not p.is_dir():
            return
        self.at_hand_over = sorted(os.listdir(p))

        def plant() -> None:
            for name in self.NAMES:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(p / name)
                os.symlink(self.outside, p / name)

        as_user(uid, gid, plant)


@pytest.fixture
def planter(outside: Path, monkeypatch: pytest.MonkeyPatch) -> Planter:
    planter = Planter(outside)
    chown, fchown = os.chown, os.fchown

    def chown_then_plant(path: Any, uid: int, gid: int, *a: Any, **kw: Any) -> None:
        chown(path, uid, gid, *a, **kw)
        if isinstance(path, (str, os.PathLike)) and kw.get("dir_fd") is None:
            planter.handed(os.fspath(path), uid, gid)

    def fchown_then_plant(fd: int, uid: int, gid: int) -> None:
        fchown(fd, uid, gid)
        planter.handed(os.readlink(f"/proc/self/fd/{fd}"), uid, gid)

    monkeypatch.setattr(os, "chown", chown_then_plant)
    monkeypatch.setattr(os, "fchown", fchown_then_plant)
    return planter


@needs_root
def test_links_planted_when_the_work_dir_is_handed_over_are_never_written_through(
    outside: Path, temp_root: Path, planter: Planter, trial_python: str
) -> None:
    """Row 1b: the script and the tracer's helper are already in the work dir when the
    trial user gets it; links it plants then are not followed by root (no write, no
    chown, no chmod of the file outside)."""
    before = fingerprint(outside)
    spec = attribute_spec("print('hello')\n")
    run, profile = finishes(lambda: trial._run(spec, trial_python, None, None, None))
    assert fingerprint(outside) == before
    assert planter.at_hand_over == sorted([*Planter.NAMES, "home", "tmp"])
    assert profile is not None and SECRET.decode() not in str(profile)
    assert os.listdir(temp_root) == []  # removed, links and all


@needs_root
def test_a_planted_script_name_is_refused_not_followed(outside: Path, reachable_tmp: Path) -> None:
    """`sandbox.give` (how the runner writes files for the build user): a link already at
    the name is refused in one line; the file outside is untouched."""
    before = fingerprint(outside)
    (reachable_tmp / "requirements.in").symlink_to(outside)
    refused = pytest.raises(safefs.UnsafePath, match="^requirements.in already exists")
    with lease_trial_user() as who, refused:
        sandbox.give(reachable_tmp / "requirements.in", who, 0o644, "leakyfixture==1.0\n")
    assert fingerprint(outside) == before


# ------------------------------------------------------- removing the work dir


@needs_root
def test_removing_a_work_dir_swapped_for_a_link_changes_nothing_outside(
    outside: Path, temp_root: Path
) -> None:
    """The trial user renames its work dir away and puts a link to a directory outside
    at its name: clean-up empties the real directory and chmods, removes or follows
    nothing else (the temp dir and the outside directory keep their modes)."""
    before, dir_before, tmp_before = (
        fingerprint(outside),
        fingerprint(outside.parent),
        fingerprint(temp_root),
    )
    with lease_trial_user() as who:
        assert who is not None
        with sandbox.private_dir(who, "leakbisect-trial-") as work:

            def swap() -> None:
                (work / "litter").write_bytes(b"x")
                work.rename(work.with_name(work.name + "-moved"))
                work.symlink_to(outside.parent)

            as_user(who.uid, who.gid, swap)
    assert fingerprint(outside) == before
    assert fingerprint(outside.parent) == dir_before
    assert fingerprint(temp_root) == tmp_before
    moved = work.with_name(work.name + "-moved")
    assert list(moved.iterdir()) == []  # emptied through the descriptor held


def test_remove_tree_follows_no_link_inside(outside: Path, tmp_path: Path) -> None:
    top = tmp_path / "work"
    (top / "d").mkdir(parents=True)
    (top / "d" / "to-file").symlink_to(outside)
    (top / "to-dir").symlink_to(outside.parent)
    os.mkfifo(top / "d" / "fifo")
    before, dir_before = fingerprint(outside), fingerprint(outside.parent)
    finishes(lambda: sandbox.remove_tree(top))
    assert not top.exists()
    assert fingerprint(outside) == before
    assert fingerprint(outside.parent) == dir_before


# ------------------------------------------------------- row 4: the profile


@pytest.fixture
def work(tmp_path: Path) -> Path:
    path = tmp_path / "work"
    path.mkdir()
    return path


def plant(kind: str, at: Path, outside: Path) -> None:
    if kind == "link":
        at.symlink_to(outside)
    elif kind == "fifo":
        os.mkfifo(at)
    else:
        at.symlink_to("/dev/zero")


PROFILE_ERRORS = {
    "link": f"the profile could not be read: {PROFILE} is a symbolic link, not a regular file",
    "fifo": f"the profile could not be read: {PROFILE} is a FIFO, not a regular file",
    "zero": f"the profile could not be read: {PROFILE} is a symbolic link, not a regular file",
}


@pytest.mark.parametrize("kind", sorted(PROFILE_ERRORS))
def test_read_profile_refuses_what_the_trial_planted(kind: str, work: Path, outside: Path) -> None:
    plant(kind, work / PROFILE, outside)
    before = fingerprint(outside)
    assert finishes(lambda: tracing.read_profile(work / PROFILE)) == {"error": PROFILE_ERRORS[kind]}
    assert fingerprint(outside) == before


def test_read_profile_is_bounded_and_checks_the_owner(work: Path) -> None:
    cap = tracing.MAX_PROFILE_BYTES
    (work / PROFILE).write_bytes(b" " * (cap + 1))
    assert tracing.read_profile(work / PROFILE) == {
        "error": f"the profile is {cap + 1} bytes; at most {cap}"
    }
    (work / PROFILE).write_bytes(b"{}")
    assert tracing.read_profile(work / PROFILE, uid=os.geteuid()) == {}
    assert tracing.read_profile(work / PROFILE, uid=4242) == {
        "error": f"the profile could not be read: {PROFILE} is owned by uid "
        f"{os.geteuid()}, not 4242"
    }


PLANTING_SCRIPT = """\
import os
{plant}
os._exit(0)  # the helper never writes its own profile over it
"""
PLANTS = {
    "link": "os.symlink({outside!r}, {profile!r})",
    "fifo": "os.mkfifo({profile!r})",
    "zero": "os.symlink('/dev/zero', {profile!r})",
}


@needs_root
@pytest.mark.parametrize("kind", sorted(PLANTS))
def test_an_attribute_trial_that_plants_its_profile_gets_an_error_not_a_hang(
    kind: str, outside: Path, temp_root: Path, trial_python: str
) -> None:
    """Row 4 end to end: the traced script (the trial user) replaces the profile with a
    link to a root-only file, a FIFO, or a link to /dev/zero; the trial ends, with the
    profile's one-line error, and nothing of the root-only file in it."""
    before = fingerprint(outside)
    code = PLANTS[kind].format(outside=str(outside), profile=PROFILE)
    spec = attribute_spec(PLANTING_SCRIPT.format(plant=code))
    run, profile = finishes(lambda: trial._run(spec, trial_python, None, None, None))
    assert run.exit_code == 0
    assert profile == {"error": PROFILE_ERRORS[kind]}
    assert fingerprint(outside) == before
    assert os.listdir(temp_root) == []


# ------------------------------------------------------- the Docker executor's copy-out


class _Archived:
    """A stopped container's `get_archive` of the profile: one tar member."""

    def __init__(self, member: tarfile.TarInfo) -> None:
        self.member = member

    def get_archive(self, path: str) -> tuple[Iterator[bytes], dict[str, Any]]:
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tar:
            tar.addfile(self.member)
        return iter([buf.getvalue()]), {"size": self.member.size}


@pytest.mark.parametrize("kind", [tarfile.FIFOTYPE, tarfile.CHRTYPE, tarfile.SYMTYPE])
def test_the_docker_profile_copy_out_reads_only_a_plain_file(kind: bytes) -> None:
    """The engine reads the profile inside the stopped container's own root (a link
    resolves there, never on the host) and hands back a tar: a FIFO, a device or a link
    member is the profile's error; nothing is opened on the host."""
    member = tarfile.TarInfo(PROFILE)
    member.type = kind
    if kind == tarfile.SYMTYPE:
        member.linkname = "/etc/shadow"
    if kind == tarfile.CHRTYPE:
        member.devmajor, member.devminor = 1, 5
    assert finishes(lambda: _profile(_Archived(member))) == {
        "error": "the profile could not be read: it is not a plain file"
    }
