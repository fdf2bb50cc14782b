"""Trials of different owners side by side cannot see each other (issue 24, row 3) and
reach no network (row 6: the local Postgres).

Two real trials through the local executor (`runners.executor.run_script`, each under a
trial user leased with `runners.users.lease_trial_user`): alice's holds a secret in its
environment and waits; bob's, given alice's host pid and paths, tries every attack of
the row and prints what happened. As root each attack fails with an exact error; the
unprivileged path (forced: the supervisor dropped to nobody before it starts) runs the
trial all the same and lists the protections it lacked.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import tempfile
import textwrap
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest

from runners import supervise
from runners.executor import NO_OWN_USER, Execution, run_script
from runners.sandbox import allowed_env, give, private_dir, private_subdir
from runners.shim import NO_NET_NS, NO_PID_NS, NO_PRIVATE_TMP
from runners.users import Identity, lease_trial_user
from tests.nsutil import NS_PID_EXPR, host_pid

MiB = 2**20
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="trial users and namespaces need root")
SECRET = "alice-secret-5f3c"

ALICE = f"""
import os, sys, time
open(sys.argv[1], "w").write("%s %d" % ({NS_PID_EXPR}, os.getpid()))
open(os.path.join(os.environ["TMPDIR"], "mine"), "w").write("alice")
while not os.path.exists(sys.argv[2]):
    time.sleep(0.05)
"""

BOB = """
import ctypes, errno, json, os, socket, sys
alice, script, tmpdir, port = int(sys.argv[1]), sys.argv[2], sys.argv[3], int(sys.argv[4])
SECRET = sys.argv[5]

def attempt(fn):
    try:
        return "ok: " + str(fn())[:200]
    except OSError as e:
        return errno.errorcode.get(e.errno, str(e.errno))

def environ():
    data = open(f"/proc/{alice}/environ", "rb").read()
    return "the secret" if b"API_KEY=" + SECRET.encode() in data else "read"

def connect(p):
    with socket.create_connection(("127.0.0.1", p), timeout=5):
        return "connected"

def ptrace():
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.ptrace(16, alice, None, None) == 0:  # PTRACE_ATTACH
        return "attached"
    raise OSError(ctypes.get_errno(), "ptrace")

def write_tmp():
    return open(os.path.join(tmpdir, "planted"), "w").write("bob")

print(json.dumps({
    "environ": attempt(environ),
    "script": attempt(lambda: open(script).read()),
    "tmpdir": attempt(write_tmp),
    "ptrace": attempt(ptrace),
    "visible": alice in [int(p) for p in os.listdir("/proc") if p.isdigit()],
    "processes": sorted(int(p) for p in os.listdir("/proc") if p.isdigit()),
    "postgres": attempt(lambda: connect(5432)),
    "host_port": attempt(lambda: connect(port)),
}))
"""


class Trial:
    """One owner's trial in a thread: leased user, private work dir, `run_script`."""

    def __init__(self, stack: ExitStack, python: str, code: str, variables: dict[str, str]):
        self.who: Identity | None = stack.enter_context(lease_trial_user())
        self.work = stack.enter_context(private_dir(self.who, "leakbisect-trial-"))
        home = private_subdir(self.work, "home", self.who)
        self.tmp = private_subdir(self.work, "tmp", self.who)
        self.env = allowed_env(home=home, tmpdir=self.tmp, variables=variables)
        self.script = give(self.work / "repro.py", self.who, text=textwrap.dedent(code))
        self.python = python
        self.result: Execution | None = None

    def run(self, *args: str) -> Execution:
        self.result = run_script(
            self.python, self.script, args=args, cwd=self.work, timeout_s=60,
            memory_limit_bytes=256 * MiB, env=self.env, run_as=self.who,
        )  # fmt: skip
        return self.result


@pytest.fixture
def drop(reachable_tmp: Path) -> Path:
    """Where the trials leave word for the test (bound into their private /tmp)."""
    d = reachable_tmp / "drop"
    d.mkdir(mode=0o777)
    d.chmod(0o777)
    return d


@pytest.fixture
def host_listener() -> Iterator[int]:
    """A port listening on the host's loopback, as any local service does."""
    with socket.create_server(("127.0.0.1", 0)) as srv:
        yield srv.getsockname()[1]


def _wait_for(path: Path, thread: threading.Thread) -> str:
    deadline = time.monotonic() + 30
    while not path.exists() and thread.is_alive() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert path.exists(), "alice's trial never started"
    return path.read_text()


@needs_root
def test_two_owners_trials_cannot_reach_each_other(
    trial_python: str, drop: Path, host_listener: int
) -> None:
    with ExitStack() as stack:
        alice = Trial(stack, trial_python, ALICE, {"API_KEY": SECRET})
        bob = Trial(stack, trial_python, BOB, {})
        assert alice.who is not None and bob.who is not None
        assert alice.who.uid != bob.who.uid  # a user per concurrent trial
        ready, done = drop / "alice.ready", drop / "alice.done"
        thread = threading.Thread(target=alice.run, args=(str(ready), str(done)))
        thread.start()
        try:
            ns, pid = _wait_for(ready, thread).split()
            target = host_pid(ns, int(pid))
            assert target is not None
            targets = (target, alice.script, alice.tmp, host_listener, SECRET)
            bob_run = bob.run(*map(str, targets))
        finally:
            done.touch()
            thread.join(60)
        assert bob_run.exit_code == 0, bob_run.log_tail
        seen = json.loads(bob_run.log_tail)
        assert seen == {
            "environ": "ENOENT",  # no such process in bob's /proc
            "script": "ENOENT",  # alice's work dir is not in bob's /tmp
            "tmpdir": "ENOENT",
            "ptrace": "ESRCH",
            "visible": False,
            "processes": [1, 2],  # bob's /proc holds bob's init (root's) and bob alone
            "postgres": "ECONNREFUSED",  # bob's own loopback, nothing listens there
            "host_port": "ECONNREFUSED",
        }
        assert sorted(os.listdir(alice.tmp)) == ["mine"]  # nothing planted
        assert alice.result is not None and alice.result.exit_code == 0
        assert bob_run.missing_protections == alice.result.missing_protections == []


@needs_root
@pytest.mark.usefixtures("without_orphan_reaper")
def test_a_slot_user_is_exclusive_and_its_leftovers_die_on_release(trial_python: str) -> None:
    """Held slots are never shared (threads of one process lock each other out too), and a
    process left running as the slot's user is killed when the lease ends."""
    with lease_trial_user() as first, lease_trial_user() as second:
        assert first is not None and second is not None and first.uid != second.uid
        import subprocess

        stray = subprocess.Popen(["sleep", "300"], user=first.uid, group=first.gid, extra_groups=[])
        assert stray.poll() is None  # alive while the lease holds
    assert stray.wait(10) == -9
    with lease_trial_user() as again:
        assert again is not None and again.name.startswith("leakbisect-trial-")


def _as_nobody(join: object) -> None:
    """Before the supervisor starts: what it would be on a runner that is not root."""
    supervise_in_child(join)
    os.setgroups([])
    os.setresgid(65534, 65534, 65534)
    os.setresuid(65534, 65534, 65534)


supervise_in_child = supervise._in_child


@needs_root
def test_unprivileged_trial_runs_and_says_what_it_lacks(
    trial_python: str, drop: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(supervise, "_in_child", _as_nobody)
    monkeypatch.setattr(sys, "executable", trial_python)  # the venv's is under /root
    script = drop / "probe.py"
    script.write_text("import os\nprint(os.getuid(), os.getpid() != 1)\n")
    script.chmod(0o644)
    ex = run_script(
        trial_python, script, cwd=drop, timeout_s=60, memory_limit_bytes=256 * MiB, run_as=None
    )
    assert (ex.exit_code, ex.log_tail) == (0, "65534 True\n")
    assert ex.missing_protections == [NO_OWN_USER, NO_PID_NS, NO_PRIVATE_TMP, NO_NET_NS]


def test_the_report_says_once_what_the_trials_lacked() -> None:
    """Every run of a job on an unprivileged runner lacks the same protections: the
    environment line names each once (text, JSON: `Report.environment`)."""
    from service.models import Job, Trial, TrialKind, TrialStatus
    from service.report import environment, environment_line

    job = Job(good="1.0", bad="2.0", script_sha256="x", package="p", script="pass")
    lacked = [NO_OWN_USER, NO_PID_NS, NO_PRIVATE_TMP, NO_NET_NS]

    def run(missing: list[str]) -> Trial:
        analysis = {"missing_protections": missing}
        return Trial(job_id=1, candidate_id=1, kind=TrialKind.RUN, status=TrialStatus.DONE,
                     analysis=analysis)  # fmt: skip

    line = environment_line(job, [run(lacked), run(lacked), run([NO_NET_NS])])
    assert line == f"{environment(job)}; trials ran without: {', '.join(lacked)}"
    assert environment_line(job, [run([]), run([])]) == environment(job)


@needs_root
def test_a_shared_tmp_directory_removed_while_the_private_tmp_is_made_is_left_out() -> None:
    """Another test's or trial's /tmp directory, deleted between the listing of /tmp and
    its bind into the private /tmp, is left out; the trial's own entry is still there (CI:
    "cannot start ...: No such file or directory: '/tmp/leakbisect-trial-...'", twice)."""
    from runners import shim

    own = Path(tempfile.mkdtemp(prefix="leakbisect-trial-race-"))
    gone = Path(tempfile.mkdtemp(prefix="leakbisect-shared-race-"))
    gone.chmod(0o755)  # root's, enterable: bound back
    listed = shim._kept_tmp_entries
    pid = os.fork()
    if pid == 0:  # the child: its own mount namespace, as the shim's init makes it
        code = 1
        try:

            def racing(cwd: str, uid: int | None) -> list[tuple[str, int]]:
                kept = listed(cwd, uid)
                gone.rmdir()  # the other test cleans up now
                return kept

            shim.unshare(shim.CLONE_NEWNS)
            shim.mount(None, "/", None, shim.MS_REC | shim.MS_PRIVATE)
            shim._kept_tmp_entries = racing
            shim._private_tmp(str(own), None)
            code = 0 if own.is_dir() and not gone.exists() else 2
        except BaseException:  # noqa: BLE001 - the exit status says it
            code = 3
        os._exit(code)
    try:
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
    finally:
        own.rmdir()
