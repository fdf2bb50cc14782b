"""Sampler on real child processes."""

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil

from runners.sampler import Sampler
from tests.fake_nvml import FakeDevice, FakeNvml, FakeProcess

MiB = 2**20


def write(tmp_path: Path, name: str, code: str) -> Path:
    p = tmp_path / name
    p.write_text(textwrap.dedent(code))
    return p


def wait_for(pred, timeout=10.0, interval=0.02):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(interval)
    return False


def test_rising_rss_of_one_process(tmp_path):
    script = write(
        tmp_path,
        "grow.py",
        """
        import os, time
        keep = []
        for i in range(10):
            keep.append(b"x" * (20 * 2**20))
            time.sleep(0.08)
        time.sleep(0.3)
        os._exit(0)  # no interpreter teardown freeing `keep` while the last samples are taken
        """,
    )
    p = subprocess.Popen([sys.executable, str(script)])
    s = Sampler(p.pid, hz=20).start()
    p.wait()
    samples = s.stop()
    assert len(samples) >= 10
    # (The very last sample can catch the kernel tearing the address space down.)
    last = max(samples[-3:], key=lambda x: x.rss)
    assert last.rss >= samples[0].rss + 150 * MiB
    assert all(b.t > a.t for a, b in zip(samples, samples[1:], strict=False))
    assert last.anon is not None and last.shared is not None
    assert last.anon + last.shared == last.rss
    assert last.anon >= 180 * MiB
    assert last.gpu is None


def test_four_process_tree_is_summed(tmp_path):
    ready = tmp_path / "ready"
    ready.mkdir()
    script = write(
        tmp_path,
        "tree.py",
        f"""
        import subprocess, sys, time, os
        child = (
            "import os, time; b = b'x' * (40 * 2**20); "
            "open(os.path.join({str(ready)!r}, str(os.getpid())), 'w').close(); time.sleep(30)"
        )
        procs = [subprocess.Popen([sys.executable, "-c", child]) for _ in range(3)]
        b = b"x" * (40 * 2**20)
        open(os.path.join({str(ready)!r}, str(os.getpid())), "w").close()
        time.sleep(30)
        """,
    )
    p = subprocess.Popen([sys.executable, str(script)], start_new_session=True)
    try:
        assert wait_for(lambda: len(os.listdir(ready)) == 4)
        s = Sampler(p.pid, hz=20)
        sample = s.sample_once()
        assert len(s.pids()) == 4
        expected = sum(psutil.Process(int(x)).memory_info().rss for x in os.listdir(ready))
        assert sample.rss >= 4 * 40 * MiB
        assert abs(sample.rss - expected) < 8 * MiB
    finally:
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()


def test_vanishing_children_are_normal(tmp_path):
    script = write(
        tmp_path,
        "churn.py",
        """
        import subprocess, sys, time
        # Children that come and go while the sampler runs.
        for i in range(12):
            subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.05 * %d)" % (i % 4)])
            time.sleep(0.05)
        time.sleep(0.5)
        """,
    )
    p = subprocess.Popen([sys.executable, str(script)], start_new_session=True)
    try:
        s = Sampler(p.pid, hz=50, refresh_s=0.05).start()
        p.wait()
        time.sleep(0.3)  # the root is gone: sampling goes on without errors, recording nothing
        samples = s.stop()
        assert len(samples) > 20
        assert s.refreshes > 10
        assert len({x.t for x in samples}) == len(samples)
        assert all(x.rss > 0 for x in samples)
        assert s.sample_once() is None
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(p.pid, signal.SIGKILL)


def test_watchdog_kills_tree_over_limit(tmp_path):
    script = write(
        tmp_path,
        "leak.py",
        """
        import subprocess, sys, time
        g = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        print(g.pid, flush=True)
        keep = []
        while True:
            keep.append(b"x" * (10 * 2**20))
            time.sleep(0.02)
        """,
    )
    p = subprocess.Popen(
        [sys.executable, str(script)], stdout=subprocess.PIPE, start_new_session=True
    )
    gpid = int(p.stdout.readline())
    fired = []
    s = Sampler(p.pid, hz=20, watchdog_limit_bytes=150 * MiB, on_watchdog=lambda: fired.append(1))
    s.start()
    try:
        p.wait(timeout=20)
    finally:
        s.stop()
    assert p.returncode == -signal.SIGKILL
    assert fired == [1] and s.watchdog_fired
    assert 150 * MiB < s.peak_rss < 600 * MiB
    assert wait_for(
        lambda: not psutil.pid_exists(gpid) or psutil.Process(gpid).status() == psutil.STATUS_ZOMBIE
    )


def test_gpu_via_fake_nvml():
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(5)"])
    try:
        from runners.nvml import GpuProbe

        fake = FakeNvml([FakeDevice(compute=[FakeProcess(p.pid, 3 * 2**30)])])
        s = Sampler(p.pid, gpu=GpuProbe.open(fake))
        sample = s.sample_once()
        assert sample.gpu == 3 * 2**30
        assert s.gpu_source == "process"
    finally:
        p.kill()
        p.wait()


def test_sampler_keeps_its_rate():
    """About hz samples per second; the CPU cost is measured by the benchmarks, not here."""
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(10)"])
    try:
        s = Sampler(p.pid, hz=10, fast_start_s=0)
        s.start()
        time.sleep(2.0)
        s.stop()
    finally:
        p.kill()
        p.wait()
    assert 12 <= len(s.samples) <= 22


def test_sampler_starts_fast_then_settles():
    """Short repros get 50 Hz for the first seconds; long runs settle to hz."""
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(10)"])
    try:
        s = Sampler(p.pid, hz=10, fast_hz=50, fast_start_s=1.0)
        s.start()
        time.sleep(2.0)
        s.stop()
    finally:
        p.kill()
        p.wait()
    first_second = [x for x in s.samples if x.t < 1.0]
    second_second = [x for x in s.samples if 1.05 <= x.t < 2.0]
    assert 35 <= len(first_second) <= 52
    assert 6 <= len(second_second) <= 11
