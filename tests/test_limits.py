"""MemoryCap: cgroup v2/v1 logic against a FAKE cgroupfs, and the real cgroup of this machine.

The fake cgroupfs is a temporary directory tree whose files the tests create:
a test double for the kernel's ``/proc/self/cgroup``, ``/proc/self/mountinfo``
and cgroup control files. `FakeKernel` patches `runners.limits._mkdir` /
`_rmdir` to do what the kernel does on cgroupfs (mkdir populates the control
files; rmdir removes a cgroup with its files).
"""

import errno
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from runners import limits
from runners.limits import CapError, MemoryCap, discover, parse_mountinfo, parse_proc_cgroup

MiB = 2**20

V2_MOUNTINFO = (
    "22 27 0:21 / /proc rw,relatime - proc proc rw\n"
    "31 23 0:28 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n"
)
V1_MOUNTINFO = (
    "31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755\n"
    "35 31 0:32 /outer /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory\n"
    "41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n"
)

V2_FILES = {
    "cgroup.procs": "",
    "cgroup.events": "populated 0\nfrozen 0\n",
    "memory.max": "max\n",
    "memory.swap.max": "max\n",
    "memory.oom.group": "0\n",
    "memory.current": "0\n",
    "memory.peak": "0\n",
    "memory.events": "low 0\nhigh 0\nmax 0\noom 0\noom_kill 0\noom_group_kill 0\n",
}
V2_PIDS_FILES = {"pids.max": "max\n", "pids.current": "0\n", "pids.events": "max 0\n"}
V1_FILES = {
    "cgroup.procs": "",
    "memory.limit_in_bytes": "9223372036854771712\n",
    "memory.memsw.limit_in_bytes": "9223372036854771712\n",
    "memory.usage_in_bytes": "0\n",
    "memory.max_usage_in_bytes": "0\n",
    "memory.failcnt": "0\n",
    "memory.oom_control": "oom_kill_disable 0\nunder_oom 0\noom_kill 0\n",
    "memory.swappiness": "60\n",
}


class FakeKernel:
    """Test double for the kernel's cgroupfs behaviour on a temp tree."""

    def __init__(self, monkeypatch, *, v2_files=V2_FILES, v1_files=V1_FILES):
        self.v2_files = v2_files
        self.v1_files = v1_files
        self.refuse: dict[str, int] = {}  # file name -> errno that writes to it get
        monkeypatch.setattr(limits, "_mkdir", self.mkdir)
        monkeypatch.setattr(limits, "_rmdir", self.rmdir)
        real_write = limits._write

        def write(path, value):
            if path.name in self.refuse:
                raise OSError(self.refuse[path.name], os.strerror(self.refuse[path.name]))
            if path.name == "cgroup.subtree_control":
                # The kernel keeps a set: "+pids" adds to what is enabled, "-x" removes.
                enabled = path.read_text().split()
                for token in value.split():
                    name = token[1:]
                    if token[0] == "+" and name not in enabled:
                        enabled.append(name)
                    elif token[0] == "-" and name in enabled:
                        enabled.remove(name)
                value = " ".join(enabled)
            real_write(path, value)

        monkeypatch.setattr(limits, "_write", write)

    def mkdir(self, path: Path) -> None:
        os.mkdir(path)
        parent = path.parent
        if (parent / "memory.limit_in_bytes").exists():  # v1: every child gets the files
            files = self.v1_files
        elif (parent / "pids.max").exists() or parent.name == "pids":  # the v1 pids tree
            files = {"cgroup.procs": "", **V2_PIDS_FILES}
        else:  # v2: controller files only for the controllers enabled in the parent
            enabled = (parent / "cgroup.subtree_control").read_text().split()
            files = {"cgroup.procs": "", "cgroup.events": "populated 0\n"}
            if "memory" in enabled:
                files.update(self.v2_files)
            if "pids" in enabled:
                files.update(V2_PIDS_FILES)
        for name, text in files.items():
            (path / name).write_text(text)

    def rmdir(self, path: Path) -> None:
        if (path / "cgroup.procs").read_text().split():
            raise OSError(errno.EBUSY, "busy")
        for f in path.iterdir():
            f.unlink()
        os.rmdir(path)


def make_v2_root(tmp_path: Path, *, controllers="cpu io memory pids", subtree="") -> Path:
    (tmp_path / "proc/self").mkdir(parents=True)
    (tmp_path / "proc/self/cgroup").write_text("0::/runner.slice/runner-1.scope\n")
    (tmp_path / "proc/self/mountinfo").write_text(V2_MOUNTINFO)
    own = tmp_path / "sys/fs/cgroup/runner.slice/runner-1.scope"
    own.mkdir(parents=True)
    (own / "cgroup.controllers").write_text(controllers + "\n")
    (own / "cgroup.subtree_control").write_text(subtree + "\n")
    (own / "cgroup.procs").write_text("")
    return own


def make_v1_root(tmp_path: Path) -> Path:
    (tmp_path / "proc/self").mkdir(parents=True)
    (tmp_path / "proc/self/cgroup").write_text("4:memory:/outer/runner\n3:cpu,cpuacct:/\n0::/\n")
    (tmp_path / "proc/self/mountinfo").write_text(V1_MOUNTINFO)
    # The mount's root is /outer, so /outer/runner lives at <mount>/runner.
    own = tmp_path / "sys/fs/cgroup/memory/runner"
    own.mkdir(parents=True)
    for name, text in V1_FILES.items():
        (own / name).write_text(text)
    unified = tmp_path / "sys/fs/cgroup/unified"
    unified.mkdir(parents=True)
    (unified / "cgroup.controllers").write_text("hugetlb\n")
    (unified / "cgroup.subtree_control").write_text("\n")
    return own


# --------------------------------------------------------------------------- parsing


def test_parse_proc_cgroup_and_mountinfo():
    cg = parse_proc_cgroup("4:memory:/a/b\n3:cpu,cpuacct:/c\n0::/d\n")
    assert cg == {"memory": "/a/b", "cpu": "/c", "cpuacct": "/c", "": "/d"}
    m = parse_mountinfo(r"35 31 0:32 /x /sys/fs/cgroup/mem\040ory rw - cgroup cgroup rw,memory")
    assert m[0].mount_point == "/sys/fs/cgroup/mem ory"
    assert m[0].mount_root == "/x"
    assert "memory" in m[0].super_options


def test_discover_v1_with_mount_root(tmp_path):
    own = make_v1_root(tmp_path)
    layout = discover(tmp_path)
    assert layout.v1_memory == own
    assert layout.v2 == tmp_path / "sys/fs/cgroup/unified"


# --------------------------------------------------------------------------- v2 (fake)


def test_v2_creates_child_with_memory_max_and_reads_oom_kill(tmp_path, monkeypatch):
    FakeKernel(monkeypatch)
    own = make_v2_root(tmp_path)
    cap = MemoryCap.create(150 * MiB, "trial 7", root=tmp_path)
    assert cap.method == "cgroup-v2"
    assert cap.path.parent == own
    assert cap.path.name.startswith("leakbisect-trial-7-")
    # The memory (and pids) controllers were enabled for children first.
    assert (own / "cgroup.subtree_control").read_text().split() == ["memory", "pids"]
    assert (cap.path / "memory.max").read_text() == str(150 * MiB)
    assert (cap.path / "pids.max").read_text() == str(limits.DEFAULT_PIDS_LIMIT)
    assert (cap.pids_path, cap.pids_limit) == (cap.path, limits.DEFAULT_PIDS_LIMIT)
    assert (cap.path / "memory.swap.max").read_text() == "0"
    assert (cap.path / "memory.oom.group").read_text() == "1"

    cap.add_pid(12345)
    assert (cap.path / "cgroup.procs").read_text() == "12345"
    (cap.path / "cgroup.procs").write_text("")

    assert cap.oom_killed() is False
    (cap.path / "memory.current").write_text("104857600\n")
    assert cap.usage_bytes() == 100 * MiB
    (cap.path / "memory.events").write_text("low 0\nhigh 0\nmax 12\noom 1\noom_kill 1\n")
    assert cap.oom_killed() is True
    assert cap.oom_kill_count() == 1

    path = cap.path
    cap.close()
    assert not path.exists()


def test_v2_preexec_writes_own_pid(tmp_path, monkeypatch):
    FakeKernel(monkeypatch)
    make_v2_root(tmp_path, subtree="memory")
    with MemoryCap.create(64 * MiB, "p", root=tmp_path) as cap:
        p = subprocess.Popen(["true"], preexec_fn=cap.preexec)
        p.wait()
        assert (cap.path / "cgroup.procs").read_text() == str(p.pid)
        (cap.path / "cgroup.procs").write_text("")  # the fake "kernel" drops the exited task


def test_v2_without_memory_controller_falls_back(tmp_path, monkeypatch):
    FakeKernel(monkeypatch)
    make_v2_root(tmp_path, controllers="cpu pids")
    cap = MemoryCap.create(64 * MiB, "x", root=tmp_path)
    assert cap.method == "watchdog"
    assert cap.path is None
    assert any("memory controller not delegated" in n for n in cap.notes)
    with pytest.raises(CapError):
        MemoryCap.create(64 * MiB, "x", method="cgroup-v2", root=tmp_path)


def test_v2_subtree_control_refused_falls_back(tmp_path, monkeypatch):
    kernel = FakeKernel(monkeypatch)
    own = make_v2_root(tmp_path)
    # The runner's own cgroup holds processes: enabling controllers for children is EBUSY.
    kernel.refuse["cgroup.subtree_control"] = errno.EBUSY
    cap = MemoryCap.create(64 * MiB, "x", root=tmp_path)
    assert cap.method == "watchdog"
    assert [p.name for p in own.iterdir() if p.is_dir()] == []


def test_v2_memory_max_write_failure_removes_child(tmp_path, monkeypatch):
    kernel = FakeKernel(monkeypatch)
    own = make_v2_root(tmp_path, subtree="memory")
    kernel.refuse["memory.max"] = errno.EACCES
    cap = MemoryCap.create(64 * MiB, "x", root=tmp_path)
    assert cap.method == "watchdog"
    assert [p.name for p in own.iterdir() if p.is_dir()] == []


# --------------------------------------------------------------------------- v1 (fake)


def test_v1_fake_limits_and_oom_control(tmp_path, monkeypatch):
    FakeKernel(monkeypatch)
    own = make_v1_root(tmp_path)
    cap = MemoryCap.create(150 * MiB, "t", root=tmp_path)
    assert cap.method == "cgroup-v1"
    assert cap.path.parent == own
    assert (cap.path / "memory.limit_in_bytes").read_text() == str(150 * MiB)
    assert (cap.path / "memory.memsw.limit_in_bytes").read_text() == str(150 * MiB)
    assert cap.oom_killed() is False
    (cap.path / "memory.oom_control").write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 2\n")
    assert cap.oom_killed() is True
    assert cap.oom_kill_count() == 2
    # An old kernel without the counter: failcnt plus a SIGKILL exit.
    (cap.path / "memory.oom_control").write_text("oom_kill_disable 0\nunder_oom 0\n")
    (cap.path / "memory.failcnt").write_text("31\n")
    assert cap.oom_killed(exit_code=-9) is True
    assert cap.oom_killed(exit_code=1) is False
    cap.close()
    assert not cap.path.exists()


def test_v1_without_swap_accounting(tmp_path, monkeypatch):
    files = {k: v for k, v in V1_FILES.items() if "memsw" not in k}
    FakeKernel(monkeypatch, v1_files=files)
    make_v1_root(tmp_path)
    with MemoryCap.create(150 * MiB, "t", root=tmp_path) as cap:
        assert cap.method == "cgroup-v1"
        assert (cap.path / "memory.swappiness").read_text() == "0"
        assert any("swap" in n for n in cap.notes)


def make_v1_pids(tmp_path: Path) -> Path:
    """Add a v1 *pids* hierarchy to `make_v1_root`'s fake: mounted at /sys/fs/cgroup/pids."""
    (tmp_path / "proc/self/cgroup").write_text(
        "5:pids:/runner\n4:memory:/outer/runner\n3:cpu,cpuacct:/\n0::/\n"
    )
    (tmp_path / "proc/self/mountinfo").write_text(
        V1_MOUNTINFO + "39 31 0:36 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids\n"
    )
    own = tmp_path / "sys/fs/cgroup/pids/runner"
    own.mkdir(parents=True)
    for name, text in {"cgroup.procs": "", **V2_PIDS_FILES}.items():
        (own / name).write_text(text)
    return own


def test_v1_fake_joins_memory_and_pids(tmp_path, monkeypatch):
    FakeKernel(monkeypatch)
    memory = make_v1_root(tmp_path)
    pids = make_v1_pids(tmp_path)
    assert discover(tmp_path).v1_pids == pids
    cap = MemoryCap.create(150 * MiB, "t", root=tmp_path, pids_limit=100)
    assert cap.method == "cgroup-v1"
    assert cap.path.parent == memory and cap.pids_path.parent == pids
    assert cap.path.name == cap.pids_path.name
    assert (cap.pids_path / "pids.max").read_text() == "100"
    assert cap.pids_limit == 100 and cap.dirs == [cap.path, cap.pids_path]
    p = subprocess.Popen(["true"], preexec_fn=cap.preexec)
    p.wait()
    assert (cap.path / "cgroup.procs").read_text() == str(p.pid)
    assert (cap.pids_path / "cgroup.procs").read_text() == str(p.pid)
    assert cap.pids() == [p.pid] and cap.memory_pids() == {p.pid}
    (cap.pids_path / "pids.events").write_text("max 7\n")
    assert cap.forks_refused() == 7
    for d in cap.dirs:
        (d / "cgroup.procs").write_text("")  # the fake "kernel" drops the exited task
    cap.close()
    assert not cap.path.exists() and not cap.pids_path.exists()


def test_v1_fake_without_pids_hierarchy_says_so(tmp_path, monkeypatch):
    FakeKernel(monkeypatch)
    make_v1_root(tmp_path)
    with MemoryCap.create(150 * MiB, "t", root=tmp_path) as cap:
        assert cap.method == "cgroup-v1"
        assert (cap.pids_path, cap.pids_limit, cap.forks_refused()) == (None, None, None)
        assert cap.notes[-1] == (
            "no pids limit from cgroup v1 (no pids hierarchy): "
            "forks are limited by RLIMIT_NPROC and the sampler"
        )
    with MemoryCap.create(150 * MiB, "t", root=tmp_path, pids_limit=None) as cap:
        assert not any("no pids limit" in n for n in cap.notes), cap.notes


def test_v2_fake_without_pids_controller_caps_memory_only(tmp_path, monkeypatch):
    FakeKernel(monkeypatch)
    own = make_v2_root(tmp_path, controllers="cpu io memory")
    with MemoryCap.create(64 * MiB, "x", root=tmp_path) as cap:
        assert cap.method == "cgroup-v2"
        assert (own / "cgroup.subtree_control").read_text().split() == ["memory"]
        assert not (cap.path / "pids.max").exists()
        assert (cap.pids_path, cap.pids_limit) == (None, None)
        assert cap.notes == [
            f"no pids limit from {own} (pids controller not delegated): "
            "forks are limited by RLIMIT_NPROC and the sampler"
        ]


def _dead_pid() -> int:
    pid = 4_000_000  # above any pid_max but the largest: never a live process here
    while psutil.pid_exists(pid):
        pid += 1
    return pid


def test_stale_cgroups_of_dead_runners_are_removed(tmp_path, monkeypatch):
    FakeKernel(monkeypatch)
    own = make_v1_root(tmp_path)
    stale = own / f"leakbisect-sleepy-{_dead_pid()}-1"
    live = own / f"leakbisect-sleepy-{os.getpid()}-99"
    other = own / "someone-elses"
    for d in (stale, live, other):
        d.mkdir()
        (d / "cgroup.procs").write_text("")
    with MemoryCap.create(64 * MiB, "t", root=tmp_path) as cap:
        assert not stale.exists()
        assert live.exists() and other.exists() and cap.path.exists()


def test_watchdog_forced(tmp_path):
    cap = MemoryCap.create(64 * MiB, "w", method="watchdog", root=tmp_path)
    assert (cap.method, cap.path, cap.usage_bytes()) == ("watchdog", None, None)
    cap.preexec()  # no-op
    assert cap.oom_killed() is False
    cap.trip()
    assert cap.oom_killed() is True
    cap.close()


def test_bad_arguments():
    with pytest.raises(ValueError):
        MemoryCap.create(0, "x")
    with pytest.raises(ValueError):
        MemoryCap.create(MiB, "x", method="ulimit")


def test_default_limit_is_80_percent_of_available():
    avail = psutil.virtual_memory().available
    got = limits.default_limit_bytes()
    assert 0 < got <= avail * 0.8 * 1.05
    assert got >= avail * 0.8 * 0.5  # not absurdly low on an idle machine


# --------------------------------------------------------------------------- the real cgroup


def _real_cgroup_method() -> str | None:
    layout = discover()
    if layout.v2 is not None:
        try:
            if "memory" in (layout.v2 / "cgroup.controllers").read_text().split():
                return "cgroup-v2?"  # may still fall back (EBUSY): tests accept either
        except OSError:
            pass
    if layout.v1_memory is not None and os.access(layout.v1_memory, os.W_OK):
        return "cgroup-v1"
    return None


REAL = _real_cgroup_method()
needs_cgroup = pytest.mark.skipif(REAL is None, reason="no writable memory cgroup here")


@needs_cgroup
def test_real_cgroup_kills_over_limit_and_cleans_up():
    with MemoryCap.create(100 * MiB, "test-limits") as cap:
        if REAL == "cgroup-v1":
            assert cap.method == "cgroup-v1"
        assert cap.method != "watchdog"
        p = subprocess.Popen(
            [sys.executable, "-c", "b = b'x' * (400 * 2**20); print('survived')"],
            preexec_fn=cap.preexec,
            stdout=subprocess.PIPE,
        )
        out, _ = p.communicate(timeout=30)
        assert p.returncode == -signal.SIGKILL
        assert b"survived" not in out
        assert cap.oom_killed(p.returncode) is True
        assert cap.oom_kill_count() >= 1
        assert cap.peak_bytes() <= 100 * MiB + MiB
        path = cap.path
    assert not path.exists()


@needs_cgroup
def test_real_v1_cgroup_has_a_pids_limit():
    layout = discover()
    if REAL != "cgroup-v1" or layout.v1_pids is None or not os.access(layout.v1_pids, os.W_OK):
        pytest.skip("no writable v1 pids hierarchy here")
    with MemoryCap.create(100 * MiB, "test-pids", pids_limit=32) as cap:
        assert cap.pids_path.parent == layout.v1_pids
        assert (cap.pids_path / "pids.max").read_text().strip() == "32"
        p = subprocess.Popen(["sleep", "30"], preexec_fn=cap.preexec)
        assert cap.pids() == [p.pid] and cap.memory_pids() == {p.pid}
        assert cap.kill_all()
        p.wait()
        dirs = cap.dirs
    assert not any(d.exists() for d in dirs)


@needs_cgroup
def test_real_cgroup_close_kills_leftovers():
    cap = MemoryCap.create(200 * MiB, "test-leftovers")
    # A grandchild in its own session: not in the child's process group, still in the cgroup.
    p = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import subprocess,sys;"
            "g=subprocess.Popen(['sleep','60'],start_new_session=True);print(g.pid,flush=True)",
        ],
        preexec_fn=cap.preexec,
        stdout=subprocess.PIPE,
    )
    gpid = int(p.stdout.readline())
    p.wait()
    assert gpid in cap.pids()
    t = time.monotonic()
    cap.close()
    assert time.monotonic() - t < 5
    assert not cap.path.exists()
    assert not psutil.pid_exists(gpid) or psutil.Process(gpid).status() == psutil.STATUS_ZOMBIE


def test_an_enclosing_cap_is_the_jobs_own_cgroup_read_never_written(tmp_path, monkeypatch):
    """Slurm's cap (runners/slurm/job.py): the smallest limit on the runner's cgroup and
    above it; oom kills counted from when it was taken; the processes already there (the
    runner, Slurm's batch shell) never the trial's; nothing created, moved or removed."""
    FakeKernel(monkeypatch)
    own = make_v1_root(tmp_path)
    job = own.parent  # Slurm limits the job or the step, not the task cgroup the runner is in
    (job / "memory.limit_in_bytes").write_text(str(300 * MiB))
    (own / "memory.limit_in_bytes").write_text(str(2**63 - 4096))
    (own / "cgroup.procs").write_text("11\n12\n")
    (own / "memory.oom_control").write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 1\n")
    cap = MemoryCap.create(123, "t", method="enclosing", root=tmp_path)
    assert (cap.method, cap.path, cap.limit_bytes) == ("enclosing", own, 300 * MiB)
    assert cap.pids() == [] and cap.oom_killed() is False  # the earlier kill is not the trial's
    (own / "cgroup.procs").write_text("11\n12\n40\n")
    (own / "memory.oom_control").write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 2\n")
    assert cap.pids() == [40] and cap.oom_killed() is True and cap.oom_kill_count() == 1
    cap.preexec()  # the child is in the cgroup already: nothing to write
    assert (own / "cgroup.procs").read_text() == "11\n12\n40\n"
    (own / "cgroup.procs").write_text("11\n12\n")  # the trial has ended (no real pid 40 killed)
    cap.close()
    assert sorted(p.name for p in own.iterdir()) == sorted(V1_FILES)  # no child cgroup
    assert (own / "memory.limit_in_bytes").read_text() == str(2**63 - 4096)


def test_an_enclosing_cgroup_without_a_limit_is_refused(tmp_path, monkeypatch):
    FakeKernel(monkeypatch)
    own = make_v1_root(tmp_path)
    (own / "memory.limit_in_bytes").write_text(str(2**63 - 4096))
    with pytest.raises(CapError, match=f"no memory limit on {own} or above it"):
        MemoryCap.create(123, "t", method="enclosing", root=tmp_path)
