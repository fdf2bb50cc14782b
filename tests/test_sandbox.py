"""The runner-side trust boundary with real processes and the real cgroups of this machine.

Each escape a hostile repro script could try, under the cap methods this machine has for
real: cgroup v1 (memory and pids hierarchies) and the watchdog (forced with
``cap_method="watchdog"``). This machine has no cgroup v2 memory controller, so the v2
parts are tested against a FAKE cgroupfs in tests/test_limits.py and here only where the
logic is the sampler's (named ``fake_v2``). Tests that need root (dropping to the trial
user) say so in their skip reason; the suite runs as root here.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import platform
import pwd
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest

from contract.errors import InvalidInput
from runners import limits, sandbox, users
from runners.executor import Execution, TrialKill, run_script
from runners.limits import MemoryCap
from runners.sampler import Sampler
from runners.supervise import Supervised, run
from runners.users import identities
from tests.nsutil import host_pid, nspid

MiB = 2**20
ROOT = os.geteuid() == 0
needs_root = pytest.mark.skipif(not ROOT, reason="dropping to the trial user needs root")
HAS_V1 = (
    limits.discover().v1_memory is not None and os.access(limits.discover().v1_memory, os.W_OK)
)
CAPS = [
    pytest.param(
        "cgroup-v1",
        marks=pytest.mark.skipif(not HAS_V1, reason="no writable v1 memory cgroup here"),
    ),
    "watchdog",
]


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def wait_for(path: Path, timeout: float = 20.0) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and path.read_text().endswith("\n"):
            return path.read_text()
        time.sleep(0.02)
    raise AssertionError(f"{path} never appeared")


def script(work: Path, code: str, name: str = "repro.py") -> Path:
    p = work / name
    p.write_text(textwrap.dedent(code))
    return p


def run_holding(work: Path, **kwargs: object) -> tuple[Execution, int]:
    """`run_script` of a script whose grandchild writes ``NS PID`` to ``grandchild`` and
    waits for ``go``: the grandchild's host pid (found while it lives), for the test to
    check after the run, and the run's execution."""
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        run = pool.submit(run_script, **kwargs)
        try:
            ns, pid = wait_for(work / "grandchild").split()
            host = host_pid(ns, int(pid))
        finally:
            (work / "go").touch()
        ex = run.result()
    assert host is not None, "the grandchild was not found running"
    return ex, host


# The escape: fork, setsid, fork again; the grandchild is nobody's child but init's (or,
# with the supervisor, the namespace's init). It reports its pid (its PID namespace's:
# the test finds the host's, then says "go"), then grows to 300 MiB.
DOUBLE_FORK = """
import os, sys, time
r, w = os.pipe()
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        keep = []
        os.write(w, b"%d\\n" % os.getpid())
        deadline = time.monotonic() + 30
        while not os.path.exists("go") and time.monotonic() < deadline:
            time.sleep(0.01)
        for _ in range(30):
            keep.append(b"x" * (10 * 2**20))
            time.sleep(0.03)
        open("grown", "w").write("%d\\n" % os.getpid())
        time.sleep(120)
    os._exit(0)
gpid = int(os.read(r, 64))
open("grandchild", "w").write("%s %d\\n" % (os.readlink("/proc/self/ns/pid"), gpid))
print("grandchild", gpid, flush=True)
{wait}
"""
# The script waits for the grandchild to die (it is not its child: poll /proc).
WAIT_FOR_DEATH = """
deadline = time.monotonic() + 30
while os.path.exists("/proc/%d" % gpid) and time.monotonic() < deadline:
    st = open("/proc/%d/stat" % gpid).read().rsplit(")", 1)[1].split()[0] if os.path.exists(
        "/proc/%d" % gpid) else "X"
    if st == "Z":
        break
    time.sleep(0.02)
print("grandchild gone", flush=True)
"""
# The script leaves as soon as the grandchild holds its 300 MiB.
LEAVE_WHEN_GROWN = """
while not os.path.exists("grown"):
    time.sleep(0.02)
time.sleep(0.3)
print("leaving", flush=True)
"""


@pytest.mark.parametrize("cap", CAPS)
def test_double_fork_setsid_grandchild_is_capped(cap, trial_dir: Path, trial_python: str) -> None:
    """Over the cap, the escaped grandchild is sampled, counted and killed by the cap."""
    code = DOUBLE_FORK.replace("{wait}", WAIT_FOR_DEATH)
    ex, gpid = run_holding(
        trial_dir, python=trial_python, script=script(trial_dir, code), cwd=trial_dir,
        timeout_s=60, memory_limit_bytes=200 * MiB, cap_method=cap,
    )  # fmt: skip
    assert ex.cap_method == cap
    assert ex.oom_killed is True
    assert not (trial_dir / "grown").exists()  # it never reached 300 MiB
    assert gone(gpid)
    # Sampled: the tree's memory includes the grandchild's growth.
    assert ex.peak_rss >= 120 * MiB, ex.peak_rss
    if cap == "watchdog":
        assert ex.exit_code == -signal.SIGKILL  # the whole tree, the script included
        assert any(n.startswith("watchdog killed the trial: memory ") for n in ex.cap_notes)
    else:
        # v1 kills the largest task (the grandchild); the script sees it die and exits.
        assert ex.exit_code == 0, ex.log_tail
        assert "grandchild gone" in ex.log_tail
        assert ex.oom_kill_count >= 1 and ex.cgroup_peak_bytes <= 200 * MiB + MiB


@pytest.mark.parametrize("cap", CAPS)
def test_double_fork_setsid_grandchild_does_not_outlive_the_trial(
    cap, trial_dir: Path, trial_python: str
) -> None:
    """Under the cap, the grandchild holding 300 MiB is sampled, then killed with the trial."""
    code = DOUBLE_FORK.replace("{wait}", LEAVE_WHEN_GROWN)
    t0 = time.monotonic()
    ex, gpid = run_holding(
        trial_dir, python=trial_python, script=script(trial_dir, code), cwd=trial_dir,
        timeout_s=60, memory_limit_bytes=1024 * MiB, cap_method=cap,
    )  # fmt: skip
    assert (ex.exit_code, ex.oom_killed, ex.timed_out) == (0, False, False), ex.log_tail
    assert time.monotonic() - t0 < 30  # not the grandchild's two minutes
    assert gone(gpid)
    assert max(s.rss for s in ex.samples) >= 300 * MiB  # the grandchild was counted
    assert ex.cap_notes == [] or all("unavailable" in n for n in ex.cap_notes)


# The cgroup.procs escape: the grandchild writes its pid into the parent of its memory cgroup
# (once the test has its host pid: `run_holding`).
PROCS_ESCAPE = """
import os, sys, time
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        open("grandchild", "w").write("%s %d\\n" % (os.readlink("/proc/self/ns/pid"), os.getpid()))
        deadline = time.monotonic() + 30
        while not os.path.exists("go") and time.monotonic() < deadline:
            time.sleep(0.01)
        mine = [l for l in open("/proc/self/cgroup") if ":memory:" in l][0].split(":", 2)[2].strip()
        parent = "/sys/fs/cgroup/memory" + os.path.dirname(mine)
        open("moving.tmp", "w").write("%d\\n" % os.getpid())
        os.rename("moving.tmp", "moving")  # whole or absent: the sampler may kill it any time now
        try:
            with open(os.path.join(parent, "cgroup.procs"), "w") as f:
                f.write(str(os.getpid()))
            result = "moved"
        except OSError as e:
            result = "refused: %s" % type(e).__name__
        now = [l for l in open("/proc/self/cgroup") if ":memory:" in l][0].split(":", 2)[2].strip()
        open("escape.tmp", "w").write("%d %s %s %s\\n" % (os.getpid(), mine, now, result))
        os.rename("escape.tmp", "escape")
        time.sleep(120)
    os._exit(0)
while not os.path.exists("moving"):
    time.sleep(0.02)
gpid = int(open("moving").read())
deadline = time.monotonic() + {patience}
while time.monotonic() < deadline:
    try:
        state = open("/proc/%d/stat" % gpid).read().rsplit(")", 1)[1].split()[0]
    except OSError:
        state = "gone"
    if state in ("gone", "Z"):
        print("escapee died during the trial", flush=True)
        break
    time.sleep(0.02)
"""


@needs_root
@pytest.mark.parametrize("cap", CAPS)
def test_cgroup_procs_escape_is_refused_to_the_trial_user(
    cap, trial_dir: Path, trial_python: str
) -> None:
    code = PROCS_ESCAPE.replace("{patience}", "1")
    ex, host = run_holding(
        trial_dir, python=trial_python, script=script(trial_dir, code), cwd=trial_dir,
        timeout_s=60, memory_limit_bytes=512 * MiB, cap_method=cap,
    )  # fmt: skip
    _, before, after, *result = (trial_dir / "escape").read_text().split()
    assert " ".join(result) == "refused: PermissionError"
    assert after == before  # still where the trial put it
    if cap == "cgroup-v1":
        assert before.rsplit("/", 1)[1].startswith(f"leakbisect-repro-{os.getpid()}-")
    assert ex.exit_code == 0, ex.log_tail
    assert "escapee died" not in ex.log_tail  # nothing killed it during the trial...
    assert gone(host)  # ...and it did not outlive it


@needs_root
@pytest.mark.skipif(not HAS_V1, reason="no writable v1 memory cgroup here")
def test_cgroup_procs_escape_as_root_succeeds_and_is_killed_at_once(
    trial_dir: Path, trial_python: str
) -> None:
    """A script running as root (run_as=None: what a non-root runner's own uid can do in a
    cgroup it owns) can move itself out; the sampler sees it outside and kills it."""
    code = PROCS_ESCAPE.replace("{patience}", "20")
    ex, host = run_holding(
        trial_dir, python=trial_python, script=script(trial_dir, code), cwd=trial_dir,
        timeout_s=60, memory_limit_bytes=512 * MiB, cap_method="cgroup-v1", run_as=None,
    )  # fmt: skip
    # The kernel took the move: the sampler saw it outside the trial's cgroup and killed it.
    # Its own report of the move is there unless that kill came first (a loaded machine).
    escape = trial_dir / "escape"
    if escape.exists():
        _, before, after, result = escape.read_text().split()
        assert result == "moved"
        assert after == before.rsplit("/", 1)[0]  # in the parent cgroup: out of the cap
    assert "escapee died during the trial" in ex.log_tail
    assert f"pid {host} left the trial's cgroup: killed" in ex.cap_notes
    assert gone(host)


FORK_BOMB = """
import os, sys, time
me = os.getpid()
while True:
    try:
        os.fork()
    except OSError as e:
        if os.getpid() == me:
            print("fork refused:", type(e).__name__, flush=True)
            time.sleep(0.5)
            sys.exit(0)
        time.sleep(120)
        os._exit(0)
"""


def _processes_running(path: Path) -> list[int]:
    found = []
    for p in psutil.process_iter(["cmdline"]):
        if str(path) in " ".join(p.info["cmdline"] or []) and p.status() != psutil.STATUS_ZOMBIE:
            found.append(p.pid)
    return found


@needs_root
@pytest.mark.parametrize("cap", CAPS)
def test_fork_bomb_is_stopped_by_the_pids_limit(cap, trial_dir: Path, trial_python: str) -> None:
    bomb = script(trial_dir, FORK_BOMB, "bomb.py")
    ex = run_script(
        trial_python, bomb, cwd=trial_dir, timeout_s=60, memory_limit_bytes=1024 * MiB,
        cap_method=cap, pids_limit=48,
    )  # fmt: skip
    assert ex.exit_code == 0, ex.log_tail
    assert ex.log_tail == "fork refused: BlockingIOError\n"
    assert _processes_running(bomb) == []
    if cap == "cgroup-v1":
        refused = [n for n in ex.cap_notes if n.startswith("the pids limit (48) refused ")]
        assert len(refused) == 1, ex.cap_notes
    # The runner survives and can start the next trial.
    ok = run_script(
        trial_python, script(trial_dir, "print('next')", "next.py"), cwd=trial_dir,
        timeout_s=60, memory_limit_bytes=256 * MiB, cap_method=cap,
    )  # fmt: skip
    assert (ok.exit_code, ok.log_tail) == (0, "next\n")


ENV_PROBE = """
import json, os, stat
cwd = os.stat(".")
home = os.stat(os.environ["HOME"])
json.dump({
    "env": dict(os.environ),
    "uid": os.getuid(), "gid": os.getgid(), "groups": os.getgroups(),
    "cwd": os.getcwd(), "cwd_mode": stat.S_IMODE(cwd.st_mode), "cwd_uid": cwd.st_uid,
    "home_mode": stat.S_IMODE(home.st_mode), "home_uid": home.st_uid,
    "fds": sorted(int(x) for x in os.listdir("/proc/self/fd")),
}, open("probe.json", "w"))
print(open("probe.json").read())
"""


def test_script_env_is_the_allowlist(trial_dir: Path, trial_python: str, monkeypatch) -> None:
    monkeypatch.setenv("BISECT_RUNNER_TOKEN", "runner-secret-123")
    monkeypatch.setenv("BISECT_DATABASE_URL", "postgresql://u:dbsecret@h/db")
    monkeypatch.setenv("DATABASE_URL", "postgresql://u:dbsecret@h/db")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "aws-secret")
    monkeypatch.setenv("UV_INDEX_URL", "http://127.0.0.1:9/simple")
    monkeypatch.setenv("TZ", "Europe/Paris")
    home = sandbox.private_subdir(trial_dir, "home", identities().trial)
    env = sandbox.allowed_env(home=home, variables={"MY_SETTING": "on"})
    ex = run_script(
        trial_python, script(trial_dir, ENV_PROBE), cwd=trial_dir, timeout_s=60,
        memory_limit_bytes=256 * MiB, env=env,
    )  # fmt: skip
    assert ex.exit_code == 0, ex.log_tail
    probe = json.loads((trial_dir / "probe.json").read_text())
    passed = {k for k in sandbox.PASSED if k in os.environ}
    assert set(probe["env"]) == passed | {"HOME", "PYTHONUNBUFFERED", "MY_SETTING"}
    assert probe["env"]["HOME"] == str(home) and probe["env"]["TZ"] == "Europe/Paris"
    assert not [k for k in probe["env"] if k.startswith("BISECT_")]
    text = json.dumps(probe["env"])
    assert "runner-secret-123" not in text and "dbsecret" not in text and "aws-secret" not in text
    assert probe["fds"] == [0, 1, 2, 3]  # 3: listdir's own; never the supervisor's status pipe
    assert probe["cwd_mode"] == 0o700 and probe["home_mode"] == 0o700
    trial = identities().trial
    if trial is not None:
        assert (probe["uid"], probe["gid"], probe["groups"]) == (trial.uid, trial.gid, [])
        assert probe["cwd_uid"] == probe["home_uid"] == trial.uid
    else:
        assert probe["uid"] == os.getuid()


def test_bisect_variables_are_refused() -> None:
    with pytest.raises(InvalidInput) as info:
        sandbox.allowed_env(home=Path("/x"), variables={"OK": "1", "bisect_api_tokens": "t"})
    assert info.value.field == "variables"
    assert str(info.value) == (
        "bisect_api_tokens is reserved: names starting with BISECT_ are the runner's own "
        "settings and never reach a script"
    )
    # An explicit environment is scrubbed too.
    assert sandbox.scrub({"A": "1", "BISECT_RUNNER_TOKEN": "x"}) == {"A": "1"}


# The script is pid 2 of its PID namespace; its parent is the namespace's init (pid 1,
# root's) and the supervisor, outside the namespace, has no pid there at all. It is given
# the supervisor's host pid (``on_start``) and tries to SIGKILL both.
KILL_SUPERVISOR = """
import os, signal, time
while not os.path.exists("supervisor"):
    time.sleep(0.01)
supervisor = int(open("supervisor").read())
seen = [os.getpid(), os.getppid(), os.path.exists("/proc/%d" % supervisor)]
for target in (supervisor, os.getppid()):
    try:
        os.kill(target, signal.SIGKILL)
        seen.append("sent")
    except OSError as e:
        seen.append(type(e).__name__)
print(*seen)
"""


# Then (as root inside) SIGTERM to its init, which forwards it.
TERM_INIT = """
os.kill(1, signal.SIGTERM)
time.sleep(30)
print("SIGTERM not forwarded")
"""


def _tell_the_supervisor(work: Path) -> Callable[[TrialKill], None]:
    def on_start(kill: TrialKill) -> None:
        (work / "supervisor").write_text(str(kill.pgid))  # the supervisor's host pid

    return on_start


@needs_root
def test_the_script_cannot_signal_its_supervisor(trial_dir: Path, trial_python: str) -> None:
    ex = run_script(
        trial_python, script(trial_dir, KILL_SUPERVISOR), cwd=trial_dir, timeout_s=60,
        memory_limit_bytes=256 * MiB, on_start=_tell_the_supervisor(trial_dir),
    )  # fmt: skip
    assert ex.missing_protections == []
    # Not in its namespace: no such process; its parent, the init, is root's: EPERM.
    assert (ex.exit_code, ex.log_tail) == (0, "2 1 False ProcessLookupError PermissionError\n")
    assert not [n for n in ex.cap_notes if "supervisor" in n or "outlived" in n], ex.cap_notes


@needs_root
def test_a_root_script_cannot_end_its_init_and_the_report_holds(
    trial_dir: Path, trial_python: str
) -> None:
    """As root inside (run_as=None), the supervisor is still out of reach; SIGKILL to pid 1
    from inside its namespace is dropped by the kernel, so the trial runs on and reports
    its own exit; SIGTERM to pid 1 is forwarded to the script, which dies of it: reported
    as that signal, as the script's own end."""
    ex = run_script(
        trial_python, script(trial_dir, KILL_SUPERVISOR + TERM_INIT), cwd=trial_dir, timeout_s=60,
        memory_limit_bytes=256 * MiB, on_start=_tell_the_supervisor(trial_dir), run_as=None,
    )  # fmt: skip
    assert (ex.exit_code, ex.timed_out) == (-signal.SIGTERM, False)
    assert ex.log_tail == "2 1 False ProcessLookupError sent\n"
    assert not [n for n in ex.cap_notes if "supervisor" in n or "outlived" in n], ex.cap_notes


@needs_root
def test_trial_user_override(trial_dir: Path, trial_python: str, monkeypatch) -> None:
    """BISECT_TRIAL_USER names the user scripts run as (created when missing)."""
    name = "leakbisect-t2"
    created = False
    try:
        pwd.getpwnam(name)
    except KeyError:
        created = True
    try:
        monkeypatch.setenv("BISECT_TRIAL_USER", name)
        other = identities().trial
        assert other is not None and other.name == name
        os.chown(trial_dir, other.uid, other.gid)
        ex = run_script(
            trial_python, script(trial_dir, "import os; print(os.getuid())"), cwd=trial_dir,
            timeout_s=60, memory_limit_bytes=256 * MiB,
        )  # fmt: skip
        assert ex.log_tail == f"{pwd.getpwnam(name).pw_uid}\n"
    finally:
        if created:
            subprocess.run(["userdel", name], check=False, capture_output=True)


# --------------------------------------------------------------------------- the supervisor


def test_supervisor_reports_exact_status(tmp_path: Path) -> None:
    env = {"PATH": "/usr/bin:/bin"}
    for code, want in (("exit 3", 3), ("kill -TERM $$", -signal.SIGTERM), ("exit 0", 0)):
        done = run(["/bin/sh", "-c", code], env=env, cwd=Path("/"), run_as=None, timeout=30)
        assert done.returncode == want
    missing = run(["/nonexistent/tool"], env=env, cwd=Path("/"), run_as=None, timeout=30)
    assert missing.returncode == 127
    assert missing.stderr.startswith("error: cannot start /nonexistent/tool: [Errno 2] ")


@needs_root
def test_supervisor_reports_exact_status_under_its_init() -> None:
    """Isolated, the command is pid 2 under the namespace's init (its host pid in the
    ``init`` line, the parent of the command's host pid), and the report is what it was
    without a namespace: the exit code, the signal it sent itself, a stop's SIGKILL."""
    env = {"PATH": "/usr/bin:/bin"}
    for code, want in (
        ("exit 3", 3), ("kill -TERM $$", -signal.SIGTERM), ("kill -KILL $$", -signal.SIGKILL),
        ("exec /nonexistent/tool", 127),  # the shell's own status
    ):  # fmt: skip
        sup = Supervised(["/bin/sh", "-c", code], cwd=Path("/"), env=env, run_as=None,
                         isolate=True)  # fmt: skip
        sup.start()
        assert sup.wait(30)
        assert sup.outcome().exit_code == want, code
        pid = sup.outcome().pid
        assert pid is not None and sup.init_pid is not None and pid != sup.init_pid
    sup = Supervised(["/nonexistent/tool"], cwd=Path("/"), env=env, run_as=None, isolate=True)
    sup.start()
    assert sup.wait(30)
    outcome = sup.outcome()
    assert (outcome.exit_code, outcome.pid) == (None, None)
    assert outcome.error is not None
    assert outcome.error.startswith("cannot start /nonexistent/tool: [Errno 2] ")
    sup = Supervised(["/bin/sh", "-c", "echo ready; exec sleep 300"], cwd=Path("/"), env=env,
                     run_as=None, isolate=True)  # fmt: skip
    proc = sup.start()
    assert proc.stdout is not None and proc.stdout.readline() == b"ready\n"
    init = sup.init_pid
    assert init is not None and nspid(init)[-1] == 1
    [command] = psutil.Process(init).children()
    assert nspid(command.pid)[-1] == 2
    sup.stop()
    sup.wait_stopped()
    assert (sup.outcome().exit_code, sup.outcome().pid) == (-signal.SIGKILL, command.pid)
    assert gone(init) and gone(command.pid)


def test_supervisor_stop_kills_every_descendant() -> None:
    code = "(setsid sleep 300 &) ; (sleep 300 &) ; echo started; exec sleep 300"
    sup = Supervised(["/bin/sh", "-c", code], cwd=Path("/"), env={"PATH": "/usr/bin:/bin"},
                     run_as=None)  # fmt: skip
    proc = sup.start()
    assert proc.stdout is not None and proc.stdout.readline() == b"started\n"
    time.sleep(0.2)
    tree = [p.pid for p in psutil.Process(proc.pid).children(recursive=True)]
    assert len(tree) == 3  # sh (exec'd into sleep) and both sleeps, all under the supervisor
    sup.stop()
    sup.wait_stopped()
    outcome = sup.outcome()
    assert outcome.exit_code == -signal.SIGKILL and outcome.error is None
    assert all(gone(pid) for pid in tree)
    assert proc.returncode == 0  # the supervisor itself ended normally, after its report


# --------------------------------------------------------------------------- directories


@needs_root
def test_blocked_by_names_the_directory(reachable_tmp: Path) -> None:
    locked = reachable_tmp / "locked"
    (locked / "bin").mkdir(parents=True)
    tool = locked / "bin" / "python"
    tool.write_text("#!/bin/sh\n")
    tool.chmod(0o755)
    locked.chmod(0o700)
    trial = identities().trial
    assert users.blocked_by(tool, trial, "x") == f"{locked} is mode 0700, owner root:root"
    locked.chmod(0o711)  # searchable, not listable: enough to run the tool
    assert users.blocked_by(tool, trial, "x") is None
    assert users.blocked_by(locked, trial, "r") == f"{locked} is mode 0711, owner root:root"
    assert users.blocked_by(tool, None, "x") is None  # the runner itself


def _running_python_is_locked_away() -> bool:
    """The runner's own interpreter is under a directory others cannot enter (pyenv under
    /root here), and no interpreter they can run has its exact version."""
    if not ROOT:
        return False
    from runners.uvrun import installed_pythons

    return users.blocked_by(
        Path(os.path.realpath(sys.executable)), identities().trial, "x"
    ) is not None and platform.python_version() not in installed_pythons()


@pytest.mark.skipif(
    not _running_python_is_locked_away(),
    reason="needs an interpreter only under a directory the sandbox users cannot enter",
)
def test_find_python_names_what_blocks_an_unreachable_interpreter() -> None:
    from runners.envs import EnvError, find_python

    version = platform.python_version()  # e.g. pyenv's 3.11.7; /usr/bin has 3.11.2
    blocker = next(
        p for p in Path(os.path.realpath(sys.executable)).parents if not p.stat().st_mode & 1
    )
    trial = identities().trial
    with pytest.raises(EnvError) as info:
        find_python(version)
    message = str(info.value)
    assert message.startswith(
        f"python {version}: no installed interpreter is reachable by {trial}: "
        f"{users.describe(blocker)} ("
    ), message
    assert message.endswith(
        f"install one outside that directory (e.g. /usr/bin/python{version}) or make its "
        "directories searchable (chmod o+x)"
    )
    assert info.value.field == "python"


# --------------------------------------------------------------------------- fake v2


def test_fake_v2_process_outside_the_cgroup_is_killed(tmp_path: Path, monkeypatch) -> None:
    """FAKE v2 cgroupfs (tests/test_limits.py's): the sampler kills a live process of the
    trial's tree that the cgroup does not list (it moved itself out)."""
    from tests.test_limits import FakeKernel, make_v2_root

    FakeKernel(monkeypatch)
    make_v2_root(tmp_path)
    parent = subprocess.Popen(
        [sys.executable, "-c", "import subprocess, sys, time; "
         "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
         "time.sleep(60)"],
    )  # fmt: skip
    try:
        with MemoryCap.create(64 * MiB, "fake", root=tmp_path) as cap:
            assert cap.method == "cgroup-v2" and cap.pids_path == cap.path
            (cap.path / "cgroup.procs").write_text(f"{parent.pid}\n")  # the child is not in it
            deadline = time.monotonic() + 10
            child = None
            while child is None and time.monotonic() < deadline:
                kids = psutil.Process(parent.pid).children()
                child = kids[0].pid if kids else None
                time.sleep(0.02)
            assert child is not None
            s = Sampler(parent.pid, listed=cap.pids, inside=cap.memory_pids, refresh_s=0)
            s.sample_once()
            assert s.escaped == [child]
            deadline = time.monotonic() + 10
            while not gone(child) and time.monotonic() < deadline:
                time.sleep(0.02)
            assert gone(child) and not gone(parent.pid)  # (a zombie: its parent sleeps)
            (cap.path / "cgroup.procs").write_text("")
    finally:
        parent.kill()
        parent.wait()
