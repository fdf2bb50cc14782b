"""The running trial's status line of `bisect-cli run` and `submit --wait`
(service/cli/display.py, issue 28).

The floors and steps from samples (contract/live.py, which a runner's heartbeat sends too),
the line's format (`status_line`), its parts from samples (`TrialWatch`) and the early-stop
state in words (contract/earlystop.py `live_state`), then `bisect-cli run --example` for
real: under a pseudo-terminal the line is redrawn in place on stderr while stdout holds only
the JSON; with stderr a pipe it is a plain line every 5 s at most. Last, `submit --wait`
against a real `serve` and `runner` under a pseudo-terminal draws the same line from the
runner's heartbeats.

The runs use a repro of the example package slower than the bundled one (60 steps of 0.1 s),
over 1.0.0..1.0.5: both bounds are clean, so the job ends after its two bound trials (exit 3,
bounds failed), each long enough for a plain line.
"""

import fcntl
import json
import os
import pty
import re
import struct
import subprocess
import sys
import termios
import threading
from pathlib import Path

from contract.earlystop import live_state
from contract.live import LiveFloors, LiveMemory
from contract.wire import EarlyStop, Sample
from service.cli.display import TrialWatch, status_line

MIB = 2**20
CLI = [sys.executable, "-m", "service.cli"]
SLOW_REPRO = """\
import time

import leakyfixture

for _ in range(60):
    leakyfixture.step()
    print("::leakbisect-step::", flush=True)
    time.sleep(0.1)
"""
LINE = r"1\.0\.[05]  elapsed (\d+)s  (\d+) steps  \d+ MiB, floor \d+→\d+  early stop: {state}"
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def test_live_state_says_which_rules_can_act() -> None:
    assert live_state(None, 10) == "off"
    assert live_state(EarlyStop(), 10) == "cap only"  # no horizon yet
    short = EarlyStop(horizon_s=30.0, horizon_steps=100)  # under MIN_HORIZON_S
    assert live_state(short, 90) == "cap only"
    no_markers = EarlyStop(horizon_s=120.0)
    assert live_state(no_markers, 0) == "cap only"
    long = EarlyStop(horizon_s=120.0, horizon_steps=101)  # looks from half its steps, 51
    assert live_state(long, 50) == "from step 51"
    assert live_state(long, 51) == "looking"


def test_the_floor_is_per_step_after_the_set_up() -> None:
    watch = TrialWatch(
        "2.4.0", started=100.0, early_stop=EarlyStop(horizon_s=90.0, horizon_steps=10)
    )
    assert watch.line(100.4) == "2.4.0  elapsed 0s  early stop: from step 5"
    for t, rss in ((0.1, 900), (0.6, 300), (1.2, 950)):  # set-up, one second at a time
        watch.add(Sample(t=t, rss=rss * MIB))
    assert watch.line(101.5) == (
        "2.4.0  elapsed 1s  0 steps  950 MiB, floor 300→300  early stop: from step 5"
    )
    # The first marker: the set-up's seconds are no floor; a floor is a step's lowest sample.
    for t, rss, step in ((1.5, 400, 1), (1.6, 380, 1), (1.7, 500, 2), (1.8, 420, 2),
                         (1.9, 460, 3), (2.0, 470, 4), (2.1, 480, 5)):  # fmt: skip
        watch.add(Sample(t=t, rss=rss * MIB, step=step))
    assert watch.line(225.0) == (
        "2.4.0  elapsed 2m05s  5 steps  480 MiB, floor 380→470  early stop: looking"
    )


def test_the_floor_tracker_folds_samples_as_a_heartbeat_sends_them() -> None:
    """contract/live.py, the one definition `run`'s line and a runner's heartbeat use."""
    floors = LiveFloors()
    assert floors.state == LiveMemory()  # nothing yet: no memory, no floor
    floors.add(Sample(t=0.1, rss=900))
    assert floors.state == LiveMemory(rss=900, steps=0)  # second 0 is still going
    floors.add(Sample(t=0.6, rss=300))
    floors.add(Sample(t=1.2, rss=950))  # second 0 is complete: its lowest is the floor
    assert floors.state == LiveMemory(rss=950, steps=0, floor_first=300, floor=300)
    floors.add(Sample(t=1.5, rss=400, step=7))  # the first marker: the set-up is no floor
    assert floors.state == LiveMemory(rss=400, steps=1)
    for t, rss, step in ((1.6, 380, 7), (1.7, 500, 8), (1.8, 420, 8), (1.9, 460, 9)):
        floors.add(Sample(t=t, rss=rss, step=step))
    assert floors.state == LiveMemory(rss=460, steps=3, floor_first=380, floor=420)
    floors.add(Sample(t=2.0, rss=470, step=1))  # a counter that starts again: never negative
    assert floors.state == LiveMemory(rss=470, steps=9, floor_first=380, floor=460)


def test_the_status_line_says_only_what_is_known() -> None:
    assert status_line("1.0.6", 4.9, "off") == "1.0.6  elapsed 4s  early stop: off"
    assert status_line("1.0.6", 65.0, None, rss=80 * MIB) == "1.0.6  elapsed 1m05s  80 MiB"
    line = status_line("1.0.6", 5.0, "cap only", rss=80 * MIB, steps=35,
                       floor_first=10 * MIB, floor=47 * MIB)  # fmt: skip
    assert line == "1.0.6  elapsed 5s  35 steps  80 MiB, floor 10→47  early stop: cap only"
    no_floor = status_line("1.0.6", 7300.0, "from step 51", rss=80 * MIB, steps=0)
    assert no_floor == "1.0.6  elapsed 2h01m  0 steps  80 MiB  early stop: from step 51"


def _env(home: Path, uv_cache: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    return env | {
        "XDG_DATA_HOME": str(home / "data"),
        "XDG_CACHE_HOME": str(home / "cache"),
        "UV_CACHE_DIR": str(uv_cache),
    }


def _args(home: Path, *extra: str) -> list[str]:
    (home / "slow.py").write_text(SLOW_REPRO)
    db = f"sqlite:///{home / 'r.db'}"
    return [*CLI, "run", "--example", str(home / "slow.py"), "--range", "1.0.0..1.0.5",
            "--no-attribute", "--json", "--database-url", db, *extra]  # fmt: skip


def _on_a_terminal(args: list[str], env: dict[str, str]) -> tuple[subprocess.CompletedProcess, str]:
    """Run `args` with stderr on a pseudo-terminal: the process (its stdout) and all the
    terminal got."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
    proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=slave, env=env)  # fmt: skip
    os.close(slave)
    chunks: list[bytes] = []

    def read() -> None:  # until the child closes the terminal (EIO)
        while True:
            try:
                data = os.read(master, 65536)
            except OSError:
                return
            if not data:
                return
            chunks.append(data)

    reader = threading.Thread(target=read)
    reader.start()
    try:
        stdout, _ = proc.communicate(timeout=600)
    finally:
        reader.join(30)
        os.close(master)
    done = subprocess.CompletedProcess(args, proc.returncode, stdout)
    return done, b"".join(chunks).decode(errors="replace")


def test_on_a_terminal_the_line_is_redrawn_in_place_and_stdout_is_the_json(
    reachable_dir, uv_cache: Path
) -> None:
    home = reachable_dir("status-pty")
    proc, raw = _on_a_terminal(_args(home), _env(home, uv_cache))
    stdout = proc.stdout
    assert proc.returncode == 3, raw[-3000:]
    report = json.loads(stdout)
    assert (report["status"], stdout.count(b"\n")) == ("bounds_failed", 1)
    text = ANSI.sub("", raw)
    shown = re.findall("▶ " + LINE.format(state="cap only"), text)
    assert shown, text[-3000:]
    assert "\x1b[1A" in raw and "\x1b[2K" in raw  # the cursor goes back up: redrawn in place


def test_without_a_terminal_plain_lines_come_at_most_every_5_s(
    reachable_dir, uv_cache: Path
) -> None:
    home = reachable_dir("status-plain")
    proc = subprocess.run(_args(home, "--no-early-stop"), capture_output=True, text=True,
                          env=_env(home, uv_cache), timeout=600)  # fmt: skip
    assert proc.returncode == 3, proc.stderr[-3000:]
    assert json.loads(proc.stdout)["status"] == "bounds_failed"
    assert "\x1b" not in proc.stderr and "▶" not in proc.stderr
    lines = proc.stderr.splitlines()
    status = re.compile("  " + LINE.format(state="off"))
    per_trial: list[list[int]] = []
    for line in lines:
        if line.startswith("running 1.0."):
            per_trial.append([])
        elif match := status.fullmatch(line):
            per_trial[-1].append(int(match.group(1)))
    assert len(per_trial) == 2 and all(per_trial), proc.stderr  # each trial has its lines
    for elapsed in per_trial:  # a line every 5 s at most, not one per sample
        assert all(b - a >= 5 for a, b in zip(elapsed, elapsed[1:], strict=False)), elapsed


def test_submit_wait_draws_the_same_line_from_the_runners_heartbeats(
    reachable_dir, uv_cache: Path, fixture_index: str, tmp_path: Path
) -> None:
    """A real `serve` and `runner` (heartbeats every second), `submit --wait --json` with
    stderr on a terminal: each running trial's line is `run`'s, then its trial and runner,
    redrawn in place; stdout holds the JSON only."""
    from tests.test_cli_service import CLI as SERVICE_CLI
    from tests.test_cli_service import Service, make_env

    svc = Service(tmp_path, make_env(tmp_path, reachable_dir("status-submit"), uv_cache))
    (tmp_path / "slow.py").write_text(SLOW_REPRO)
    try:
        svc.start_serve(f"sqlite:///{tmp_path / 'service.db'}")
        svc.start_runner("runner-a")
        args = [*SERVICE_CLI, "submit", str(tmp_path / "slow.py"), "--package", "leakyfixture",
                "--range", "1.0.0..1.0.5", "--index-url", fixture_index, "--wait", "--json",
                "--server", svc.url]  # fmt: skip
        # Wide enough for the trial and runner at the end (Rich reads the width from
        # COLUMNS here: stdin and stdout are no terminal; a narrower line ends in "…").
        proc, raw = _on_a_terminal(args, svc.env | {"COLUMNS": "200"})
    finally:
        svc.stop()
    logs = "".join(p.read_text() for p in svc.logs)
    assert proc.returncode == 3, raw[-3000:] + logs  # both bounds clean: bounds failed
    report = json.loads(proc.stdout)  # stdout is the JSON alone; the lines are on stderr
    assert (report["status"], proc.stdout.count(b"\n")) == ("bounds_failed", 1)
    text = ANSI.sub("", raw)
    line = LINE.format(state="cap only") + r"  \(trial \d+, r-[0-9a-z]+\)"
    shown = re.findall("▶ " + line, text)
    assert shown and any(int(steps) > 0 for _, steps in shown), text[-3000:]
    assert "\x1b[1A" in raw and "\x1b[2K" in raw  # redrawn in place
