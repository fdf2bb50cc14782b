"""run_script with real child processes, real sampling and the real memory cap of this machine."""

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from contract.wire import Sample
from runners import executor, limits
from runners.executor import run_script
from runners.markers import STEP_MARKER, parse_marker
from runners.sampler import Sampler
from tests.nsutil import NS_PID_EXPR, host_pid, nspid

MiB = 2**20


@pytest.fixture(autouse=True)
def py(trial_python: str) -> str:
    """The interpreter scripts run with: one the trial user can run when tests run as root."""
    global PY
    PY = trial_python
    return PY


PY = sys.executable  # replaced by the fixture above before each test


def write(trial_dir: Path, code: str, name: str = "repro.py") -> Path:
    p = trial_dir / name
    p.write_text(textwrap.dedent(code))
    return p


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def expected_cgroup_method() -> str | None:
    layout = limits.discover()
    if layout.v2 is not None:
        try:
            if "memory" in (layout.v2 / "cgroup.controllers").read_text().split():
                return None  # v2 may or may not be usable (EBUSY): do not pin it
        except OSError:
            pass
    if layout.v1_memory is not None and os.access(layout.v1_memory, os.W_OK):
        return "cgroup-v1"
    return "watchdog"


def test_growing_script_sampled_with_numbered_steps(trial_dir):
    script = write(
        trial_dir,
        """
        import time
        from runners.markers import step
        keep = []
        print("starting")
        for i in range(10):
            step(i + 1)
            keep.append(b"x" * (20 * 2**20))
            print("did step", i + 1)
            time.sleep(0.08)
        time.sleep(0.3)
        print("done", flush=True)
        import os
        os._exit(0)  # no interpreter teardown freeing `keep` while the last samples are taken
        """,
    )
    seen = []
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1]))
    ex = run_script(
        PY,
        script,
        cwd=trial_dir,
        timeout_s=30,
        memory_limit_bytes=1024 * MiB,
        env=env,
        on_sample=seen.append,
    )
    assert ex.exit_code == 0, ex.log_tail
    assert not ex.oom_killed and not ex.timed_out
    assert [s for _, s in ex.steps] == list(range(1, 11))
    assert all(b[0] > a[0] for a, b in zip(ex.steps, ex.steps[1:], strict=False))
    assert STEP_MARKER not in ex.log_tail
    assert "did step 10" in ex.log_tail and "starting" in ex.log_tail
    rss = [s.rss for s in ex.samples]
    assert len(rss) >= 8
    assert max(rss[-3:]) >= rss[0] + 150 * MiB
    after_last_step = [s.rss for s in ex.samples if s.step == 10][:-1]
    assert after_last_step and min(after_last_step) >= rss[0] + 150 * MiB
    # Samples carry the step seen at that instant; they rise with the steps.
    stepped = [s.step for s in ex.samples if s.step is not None]
    assert stepped == sorted(stepped) and stepped[-1] == 10
    assert seen and seen[-1].rss == ex.samples[-1].rss
    assert ex.gpu_source == "unavailable" and ex.host_source == "psutil"
    assert ex.duration_s >= 0.8


def test_unnumbered_markers_are_counted(trial_dir):
    script = write(
        trial_dir,
        f"""
        print({STEP_MARKER!r}, flush=True)
        print({STEP_MARKER!r} + " not-a-number", flush=True)
        print("text")
        print({STEP_MARKER!r} + " 10", flush=True)
        print({STEP_MARKER!r}, flush=True)
        print("  " + {STEP_MARKER!r})  # not at the start of the line: ordinary output
        """,
    )
    ex = run_script(PY, script, cwd=trial_dir, timeout_s=30, memory_limit_bytes=512 * MiB)
    assert [s for _, s in ex.steps] == [1, 2, 10, 11]
    assert ex.log_tail.splitlines() == ["text", "  " + STEP_MARKER]


def test_parse_marker():
    assert parse_marker("::leakbisect-step:: 7\n") == (True, 7)
    assert parse_marker("::leakbisect-step::\n") == (True, None)
    assert parse_marker("step 7") == (False, None)


def test_exit_125_passed_through(trial_dir):
    script = write(trial_dir, "import sys; print('cannot test'); sys.exit(125)")
    ex = run_script(PY, script, cwd=trial_dir, timeout_s=30, memory_limit_bytes=512 * MiB)
    assert ex.exit_code == 125
    assert not ex.oom_killed and not ex.timed_out


def test_crash_keeps_stderr_tail(trial_dir):
    script = write(
        trial_dir,
        """
        import sys
        for i in range(400):
            print("chatty line %04d ........................" % i)
        sys.stdout.flush()
        def f():
            raise ValueError("boom in the repro")
        f()
        """,
    )
    ex = run_script(PY, script, cwd=trial_dir, timeout_s=30, memory_limit_bytes=512 * MiB)
    assert ex.exit_code == 1
    assert ex.oom_killed is False
    assert "ValueError: boom in the repro" in ex.stderr_tail
    assert "ValueError: boom in the repro" in ex.log_tail
    assert "Traceback" in ex.log_tail
    assert len(ex.log_tail) <= 4200


def test_exit_3_with_traceback(trial_dir):
    script = write(
        trial_dir,
        """
        import sys, traceback
        try:
            {}["missing"]
        except KeyError:
            traceback.print_exc()
            sys.exit(3)
        """,
    )
    ex = run_script(PY, script, cwd=trial_dir, timeout_s=30, memory_limit_bytes=512 * MiB)
    assert (ex.exit_code, ex.oom_killed, ex.timed_out) == (3, False, False)
    assert "KeyError: 'missing'" in ex.stderr_tail
    assert "KeyError: 'missing'" in ex.log_tail


def test_timeout_kills_the_whole_tree(trial_dir):
    pids = trial_dir / "pids"
    script = write(
        trial_dir,
        f"""
        import os, subprocess, sys, time
        g = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
        open({str(pids)!r}, "w").write("%s %d %d" % ({NS_PID_EXPR}, os.getpid(), g.pid))
        time.sleep(120)
        """,
    )
    t = time.monotonic()
    ex = run_script(PY, script, cwd=trial_dir, timeout_s=1.5, memory_limit_bytes=512 * MiB)
    assert time.monotonic() - t < 10
    assert ex.timed_out is True
    assert ex.exit_code == -9
    assert ex.oom_killed is False
    ns, child, grandchild = pids.read_text().split()
    assert host_pid(ns, int(child)) is None and host_pid(ns, int(grandchild)) is None
    assert 1.4 <= ex.duration_s < 5


LEAK = """
import time
keep = []
while True:
    keep.append(b"x" * (8 * 2**20))
    time.sleep(0.01)
"""


def _machine_is_fine(trial_dir):
    assert psutil.virtual_memory().available > 2 * 2**30
    ok = run_script(
        PY,
        write(trial_dir, "print('ok')", "ok.py"),
        cwd=trial_dir,
        timeout_s=30,
        memory_limit_bytes=256 * MiB,
    )
    assert ok.exit_code == 0 and ok.log_tail == "ok\n"


def test_runaway_leak_killed_by_the_cap(trial_dir):
    expected = expected_cgroup_method()
    ex = run_script(
        PY, write(trial_dir, LEAK), cwd=trial_dir, timeout_s=30, memory_limit_bytes=150 * MiB
    )
    if expected is not None:
        assert ex.cap_method == expected  # "cgroup-v1" on the development machine
    assert ex.oom_killed is True
    assert ex.exit_code == -9
    assert ex.timed_out is False
    assert ex.samples and max(s.rss for s in ex.samples) <= 150 * MiB + 16 * MiB
    if ex.cap_method.startswith("cgroup"):
        assert ex.oom_kill_count >= 1
        assert ex.cgroup_peak_bytes <= 150 * MiB + MiB
    # The trial's cgroup is gone.
    layout = limits.discover()
    for d in (layout.v1_memory, layout.v2):
        if d is not None:
            assert not [
                p for p in d.iterdir() if p.name.startswith(f"leakbisect-repro-{os.getpid()}-")
            ]
    _machine_is_fine(trial_dir)


def test_runaway_leak_killed_by_the_watchdog(trial_dir):
    ex = run_script(
        PY,
        write(trial_dir, LEAK),
        cwd=trial_dir,
        timeout_s=30,
        memory_limit_bytes=150 * MiB,
        cap_method="watchdog",
    )
    assert ex.cap_method == "watchdog"
    assert ex.oom_killed is True
    assert ex.exit_code == -9
    assert ex.timed_out is False
    assert 150 * MiB < ex.peak_rss < 600 * MiB  # overshoot: one sample period of leaking
    _machine_is_fine(trial_dir)


def test_four_process_tree_summed(trial_dir):
    script = write(
        trial_dir,
        """
        import multiprocessing as mp, time

        def hold(n):
            b = b"x" * (40 * 2**20)
            time.sleep(1.5)

        if __name__ == "__main__":
            ps = [mp.get_context("fork").Process(target=hold, args=(i,)) for i in range(3)]
            for p in ps:
                p.start()
            b = b"x" * (40 * 2**20)
            time.sleep(1.5)
            for p in ps:
                p.join()
        """,
    )
    ex = run_script(
        PY, script, cwd=trial_dir, timeout_s=30, memory_limit_bytes=1024 * MiB, sample_hz=20
    )
    assert ex.exit_code == 0, ex.log_tail
    peak = max(s.rss for s in ex.samples)
    # 4 x 40 MiB of private data, plus the interpreters (forked: partly shared pages
    # are counted in every process's RSS, as RSS does).
    assert peak >= 4 * 40 * MiB
    assert peak < 4 * 40 * MiB + 4 * 60 * MiB


def test_default_cap_when_none(trial_dir):
    ex = run_script(
        PY, write(trial_dir, "pass"), cwd=trial_dir, timeout_s=30, memory_limit_bytes=None
    )
    assert ex.exit_code == 0
    avail = psutil.virtual_memory().available
    assert 0.5 * 0.8 * avail < ex.memory_limit_bytes <= 0.8 * avail * 1.05
    assert ex.cap_method in ("cgroup-v1", "cgroup-v2", "watchdog")


def test_grandchild_left_behind_is_killed(trial_dir):
    pids = trial_dir / "pids"
    script = write(
        trial_dir,
        f"""
        import os, subprocess, sys
        g = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        open({str(pids)!r}, "w").write("%s %d" % ({NS_PID_EXPR}, g.pid))
        """,
    )
    ex = run_script(PY, script, cwd=trial_dir, timeout_s=30, memory_limit_bytes=512 * MiB)
    assert ex.exit_code == 0
    ns, pid = pids.read_text().split()
    assert host_pid(ns, int(pid)) is None


def test_env_is_complete_environment(trial_dir):
    script = write(
        trial_dir, "import os; print(os.environ.get('ONLY'), os.environ.get('PYTHONUNBUFFERED'))"
    )
    ex = run_script(
        PY, script, cwd=trial_dir, timeout_s=30, memory_limit_bytes=256 * MiB, env={"ONLY": "yes"}
    )
    assert ex.log_tail == "yes 1\n"


def test_script_dies_with_a_killed_runner(trial_dir: Path) -> None:
    """A runner SIGKILLed mid-trial leaves no script running (PDEATHSIG)."""
    pidfile = trial_dir / "script.pid"
    script = trial_dir / "sleepy.py"
    script.write_text(
        f"import os, time\nopen({str(pidfile)!r}, 'w')"
        f".write('%s %d' % ({NS_PID_EXPR}, os.getpid()))\ntime.sleep(120)\n"
    )
    runner = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys; from pathlib import Path; from runners.executor import run_script; "
            f"run_script({PY!r}, Path({str(script)!r}), cwd=Path({str(trial_dir)!r}), "
            "timeout_s=120, memory_limit_bytes=None)",
        ],
        cwd=Path(__file__).resolve().parents[1],
    )
    deadline = time.monotonic() + 30
    while not pidfile.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    ns, pid = pidfile.read_text().split()
    child = host_pid(ns, int(pid))
    assert child is not None and psutil.pid_exists(child)
    runner.kill()
    runner.wait()
    deadline = time.monotonic() + 10
    while psutil.pid_exists(child) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not psutil.pid_exists(child)
    # The killed runner could not remove its cgroups; the next trial on the machine does.
    run_script(PY, write(trial_dir, "pass", "next.py"), cwd=trial_dir, timeout_s=30,
               memory_limit_bytes=256 * MiB)  # fmt: skip
    layout = limits.discover()
    for d in (layout.v1_memory, layout.v1_pids, layout.v2):
        if d is not None:
            assert not list(d.glob(f"leakbisect-sleepy-{runner.pid}-*")), d


# --------------------------------------------------------------------------- the init
# As root a script runs as pid 2 of its own PID namespace under an init (runners/shim.py
# Init). A pid 1 ignores every signal it sends itself and never reaps its orphans; the
# script, under its init, behaves and is reported exactly as without a namespace.


@pytest.mark.parametrize(
    ("code", "want"),
    [
        ("sys.exit(0)", 0),
        ("sys.exit(3)", 3),
        ("sys.exit(255)", 255),
        ("os.kill(os.getpid(), signal.SIGTERM); time.sleep(30)", -signal.SIGTERM),
        ("signal.raise_signal(signal.SIGTERM); time.sleep(30)", -signal.SIGTERM),
        ("os.kill(os.getpid(), signal.SIGKILL); time.sleep(30)", -signal.SIGKILL),
        ("raise KeyboardInterrupt", -signal.SIGINT),  # Python re-raises SIGINT on itself
    ],
)
def test_the_scripts_own_status_is_reported(trial_dir: Path, code: str, want: int) -> None:
    script = write(trial_dir, f"import os, signal, sys, time\n{code}\n")
    ex = run_script(PY, script, cwd=trial_dir, timeout_s=60, memory_limit_bytes=256 * MiB)
    assert (ex.exit_code, ex.timed_out, ex.error) == (want, False, None), ex.log_tail
    assert not [n for n in ex.cap_notes if "supervisor" in n], ex.cap_notes


# The script's child double-forks and exits: the grandchild, holding 200 MiB, is an orphan
# (its parent is now pid 1, the init) and waits until the test has sampled it; the script
# then watches it go: "reaped" once it is gone from /proc ("zombie": nobody reaped it).
ORPHAN = """
import os, sys, time

def wait(path):
    deadline = time.monotonic() + 30
    while not os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.01)

r, w = os.pipe()
child = os.fork()
if child == 0:
    if os.fork() == 0:
        keep = b"x" * (200 * 2**20)
        os.write(w, b"%d\\n" % os.getpid())
        wait("sampled")
    os._exit(0)
os.waitpid(child, 0)
gpid = int(os.read(r, 64))
stat = "/proc/%d/stat" % gpid
ppid = int(open(stat).read().rsplit(")", 1)[1].split()[1])
deadline = time.monotonic() + 10
while os.path.exists(stat) and time.monotonic() < deadline:
    time.sleep(0.01)
try:
    state = "zombie" if open(stat).read().rsplit(")", 1)[1].split()[0] == "Z" else "alive"
except FileNotFoundError:
    state = "reaped"
print(ppid, state)
"""


def test_an_orphan_is_sampled_while_it_lives_and_reaped(trial_dir: Path) -> None:
    def on_sample(sample: Sample) -> None:
        if sample.rss >= 200 * MiB:
            (trial_dir / "sampled").touch()

    ex = run_script(
        PY, write(trial_dir, ORPHAN), cwd=trial_dir, timeout_s=60,
        memory_limit_bytes=512 * MiB, on_sample=on_sample,
    )  # fmt: skip
    assert (ex.exit_code, ex.log_tail) == (0, "1 reaped\n")
    assert ex.peak_rss >= 200 * MiB


@pytest.mark.skipif(os.geteuid() != 0, reason="no PID namespace, so no init, without root")
def test_the_init_is_not_sampled(trial_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The sampler counts the script and what it starts, never the namespace's init (its
    memory, a fork of the supervisor, is not the trial's)."""
    samplers: list[Sampler] = []

    class Recording(Sampler):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            samplers.append(self)

    seen: list[list[int]] = []  # each sampled process's pids, the host's first

    def on_sample(_: Sample) -> None:
        for pid in samplers[0].pids():
            with contextlib.suppress(OSError):
                seen.append(nspid(pid))
        if [2] in [p[-1:] for p in seen]:
            (trial_dir / "sampled").touch()

    monkeypatch.setattr(executor, "Sampler", Recording)
    code = """
    import os, time
    deadline = time.monotonic() + 30
    while not os.path.exists("sampled") and time.monotonic() < deadline:
        time.sleep(0.01)
    print(os.getpid())
    """
    ex = run_script(
        PY, write(trial_dir, code), cwd=trial_dir, timeout_s=60, memory_limit_bytes=256 * MiB,
        on_sample=on_sample,
    )  # fmt: skip
    assert (ex.exit_code, ex.log_tail, ex.missing_protections) == (0, "2\n", [])
    assert seen and all(len(p) == 2 and p[-1] != 1 for p in seen), seen
