"""engine/attribution.py: per-stack growth compared between the boundary pair, and when a
traced run stops (pure); the helper's own pieces and its stops in real child processes
(runners/tracehelper.py); the stop on the way to the helper (runners/tracing.py, the
Docker run phase)."""

import io
import json
import math
import signal
import subprocess
import sys
import time
import tracemalloc
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlmodel import Session, col, select

from contract.wire import TraceStop
from engine import attribution
from engine.attribution import MIB, NATIVE_NOTE, compare, growth, headline
from engine.findings import attribution_lines
from runners import tracehelper, tracing
from runners.docker.spec import DockerSettings, run_kwargs
from service.db import make_engine, upgrade
from service.models import Candidate, Job, Trial, TrialKind, TrialStatus
from service.scheduler import advance
from service.specs import trial_spec

LEAK = [["repro.py", 24, "main"], ["leakyfixture/__init__.py", 30, "step"],
        ["leakyfixture/__init__.py", 22, "_touched"]]  # fmt: skip
CACHE = [["repro.py", 24, "main"], ["leakyfixture/__init__.py", 41, "step"]]
HELPER = [["repro.py", 30, "helper"], ["json/decoder.py", 353, "raw_decode"]]


def profile(*stacks: tuple[list, list[int]]) -> dict:
    n = len(stacks[0][1]) if stacks else 0
    return {
        "tracer": "tracemalloc",
        "error": None,
        "snapshots": [{"t": float(i), "step": i} for i in range(n)],
        "stacks": [{"frames": frames, "sizes": sizes} for frames, sizes in stacks],
    }


def test_growth_is_counted_after_the_first_third_and_per_interval() -> None:
    # Cache: fills in the first third, then flat. Leak: 1 MiB per snapshot throughout.
    found = growth(profile((CACHE, [0, 4 * MIB, 4 * MIB, 4 * MIB, 4 * MIB, 4 * MIB, 4 * MIB]),
                           (LEAK, [i * MIB for i in range(7)])))  # fmt: skip
    key = lambda frames: tuple((f, n, fn) for f, n, fn in frames)  # noqa: E731
    assert found[key(CACHE)] == (0, 0.0)
    assert found[key(LEAK)] == (4 * MIB, 1.0)


def test_the_stack_that_grows_in_the_first_bad_release_only_is_named_at_its_package_line() -> None:
    good = profile((CACHE, [0, 4 * MIB] + [4 * MIB] * 5), (HELPER, [MIB] * 7))
    bad = profile((CACHE, [0, 4 * MIB] + [4 * MIB] * 5), (HELPER, [MIB] * 7),
                  (LEAK, [i * MIB for i in range(7)]))  # fmt: skip
    found = compare(good, bad, "leakyfixture", tracer="tracemalloc", rss_growth_bytes=5 * MIB)
    assert found == {
        "tracer": "tracemalloc",
        "available": True,
        "note": None,
        "stacks": [
            {
                "site": "leakyfixture/__init__.py:22 in _touched",
                "in_package": True,
                "growth_bytes": 4 * MIB,
                "good_growth_bytes": 0,
                "grew_in": 1.0,
                "frames": [
                    "leakyfixture/__init__.py:22 in _touched",
                    "leakyfixture/__init__.py:30 in step",
                    "repro.py:24 in main",
                ],
            }
        ],
    }
    assert headline(found) == (
        "grows at leakyfixture/__init__.py:22 in _touched (+4.0 MiB, tracemalloc)"
    )


def test_a_stack_that_grows_as_much_in_the_last_good_release_is_not_blamed() -> None:
    both = profile((LEAK, [i * MIB for i in range(7)]))
    found = compare(both, both, "leakyfixture", tracer="tracemalloc")
    assert (found["stacks"], found["note"]) == (
        [], "no stack grows in the first bad release and not in the last good one"
    )  # fmt: skip


def test_rss_growth_that_no_python_stack_explains_is_called_native() -> None:
    flat = profile((CACHE, [4 * MIB] * 7))
    found = compare(flat, flat, "leakyfixture", tracer="tracemalloc", rss_growth_bytes=40 * MIB)
    assert found["note"] == (f"{NATIVE_NOTE}: the stacks explain 0.0 MiB of 40.0 MiB of RSS growth")
    assert found["stacks"] == [] and headline(found) is None


def test_outside_the_package_the_site_is_the_innermost_frame() -> None:
    bad = profile((HELPER, [0, 0, MIB, 2 * MIB]))
    found = compare(profile((HELPER, [0, 0, 0, 0])), bad, "orbax-checkpoint", tracer="tracemalloc")
    assert [(s["site"], s["in_package"]) for s in found["stacks"]] == [
        ("json/decoder.py:353 in raw_decode", False)
    ]


def test_a_memray_profile_grows_by_what_is_live_at_the_end() -> None:
    native = [["repro.py", 24, "main"], ["leakyfixture/__init__.py", 57, "_native"],
              ["leak.c", 5, "leak"]]  # fmt: skip
    good = {"tracer": "memray", "snapshots": [{"t": 2.0}], "stacks": []}
    bad = {"tracer": "memray", "snapshots": [{"t": 2.0}],
           "stacks": [{"frames": native, "sizes": [40 * MIB]}]}  # fmt: skip
    found = compare(good, bad, "leakyfixture", tracer="memray", rss_growth_bytes=40 * MIB)
    assert [(s["site"], s["growth_bytes"], s["grew_in"]) for s in found["stacks"]] == [
        ("leakyfixture/__init__.py:57 in _native", 40 * MIB, None)
    ]
    assert found["stacks"][0]["frames"][0] == "leak.c:5 in leak"


def test_a_missing_or_failed_profile_is_unavailable_with_its_reason() -> None:
    failed = {"tracer": "memray", "error": "memray did not install: no wheel for musl"}
    assert compare(profile(), failed, "x", tracer="memray") == {
        "tracer": "memray", "available": False, "note": "memray did not install: no wheel for musl",
        "stacks": [],
    }  # fmt: skip
    assert compare(None, profile(), "x", tracer="tracemalloc")["note"] == (
        "the traced run wrote no profile"
    )


def test_frames_are_named_relative_to_site_packages_and_by_their_def(tmp_path: Path) -> None:
    module = tmp_path / "lib" / "site-packages" / "pkg" / "mod.py"
    module.parent.mkdir(parents=True)
    module.write_text("def outer():\n    x = 1\n\n    def inner():\n        return x\n"
                      "    return inner\n")  # fmt: skip
    assert tracehelper.relative(str(module)) == "pkg/mod.py"
    assert tracehelper.relative("/work/repro.py") == "repro.py"
    assert [tracehelper.function_at(str(module), n) for n in (2, 4, 5, 6)] == [
        "outer", "inner", "inner", "outer"
    ]  # fmt: skip
    assert tracehelper.from_script([["<frozen runpy>", 88, "_run_code"], ["repro.py", 3, "m"],
                                    ["pkg/mod.py", 5, "inner"]], "/w/repro.py") == [
        ["repro.py", 3, "m"], ["pkg/mod.py", 5, "inner"]
    ]  # fmt: skip


def test_a_memray_stack_keeps_the_package_line_under_a_c_extensions_frames() -> None:
    # msgpack's unpackb, as memray's hybrid_stack_trace gives it (innermost first): twelve
    # frames of the allocator, CPython and the extension under the package's line.
    native = [("_PyObject_Malloc", "Objects/obmalloc.c", 2003),
              ("_PyObject_Malloc", "Objects/obmalloc.c", 1996),
              ("_PyBytes_FromSize", "Objects/bytesobject.c", 103),
              ("_PyBytes_FromSize", "Objects/bytesobject.c", 84),
              ("PyBytes_FromStringAndSize", "Objects/bytesobject.c", 136),
              ("unpack_callback_bin", "msgpack/unpack.h", 272),
              ("unpack_execute", "msgpack/unpack_template.h", 281),
              ("unpack_construct", "msgpack/unpack_template.h", 407),
              ("__pyx_pf_7msgpack_9_cmsgpack_2unpackb", "msgpack/_cmsgpack.c", 13446),
              ("__pyx_pw_7msgpack_9_cmsgpack_3unpackb", "msgpack/_cmsgpack.c", 13138),
              ("_PyObject_VectorcallTstate", "./Include/internal/pycore_call.h", 92),
              ("PyObject_Vectorcall", "Objects/call.c", 299),
              ("step", "/v/lib/python3.11/site-packages/leakycodec/__init__.py", 14),
              ("<module>", "/w/repro.py", 4), ("<unknown>", "<unknown>", 0),
              ("_PyEval_Vector", "Python/ceval.c", 6434)]  # fmt: skip
    frames = tracehelper._memray_frames(native, "/w/repro.py")
    assert frames[:2] == [["repro.py", 4, "<module>"], ["leakycodec/__init__.py", 14, "step"]]
    assert len(frames) == 14 and frames[-1] == ["obmalloc.c", 2003, "_PyObject_Malloc"]
    bad = {"snapshots": [{"t": 1.0}], "stacks": [{"frames": frames, "sizes": [MIB]}]}
    found = compare({"snapshots": [{"t": 1.0}], "stacks": []}, bad, "leakycodec", tracer="memray")
    assert (found["stacks"][0]["site"], found["stacks"][0]["in_package"]) == (
        "leakycodec/__init__.py:14 in step", True
    )  # fmt: skip


def test_step_markers_pass_through_and_each_is_counted_then_reported() -> None:
    out = io.StringIO()
    seen: list[tuple[int | None, int]] = []
    limits = tracehelper.Limits()
    wrapped = tracehelper.MarkerStdout(out, limits, lambda n, i: seen.append((n, i)))  # type: ignore[arg-type]
    print("::leakbisect-step::", file=wrapped)
    print("loss 0.3\n::leakbisect-step:: 7", file=wrapped)
    wrapped.write("::leakbisect-step:: not-a-number\npartial")
    assert out.getvalue() == (
        "::leakbisect-step::\nloss 0.3\n::leakbisect-step:: 7\n"
        "::leakbisect-step:: not-a-number\npartial"
    )
    assert seen == [(None, 1), (7, 2), (None, 3)] and limits.seen == 3


def test_the_helper_runs_a_script_as_python_would_and_writes_its_profile(tmp_path: Path) -> None:
    script = tmp_path / "repro.py"
    script.write_text(
        "import sys\nkept = []\n"
        "def grow():\n    kept.append(bytearray(512 * 1024))\n"
        "for _ in range(12):\n    grow()\n    print('::leakbisect-step::', flush=True)\n"
        "sys.exit(3)\n"
    )
    out = tmp_path / "profile.json"
    proc = subprocess.run(
        [sys.executable, tracehelper.__file__, "tracemalloc", str(out), str(script)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 3, proc.stderr
    assert proc.stdout == "::leakbisect-step::\n" * 12
    written = json.loads(out.read_text())
    assert (written["tracer"], written["error"]) == ("tracemalloc", None)
    top = written["stacks"][0]
    assert top["frames"] == [["repro.py", 6, "<module>"], ["repro.py", 4, "grow"]]
    assert top["sizes"][-1] >= 12 * 512 * 1024
    assert len(top["sizes"]) == len(written["snapshots"]) >= 2


# --- the pair over the same steps (rule 1) --------------------------------------------

SPIKE = [["repro.py", 24, "main"], ["leakyfixture/__init__.py", 35, "step"]]


def marked(*stacks: tuple[list, list[int]], markers: list[int]) -> dict:
    found = profile(*stacks)
    found["snapshots"] = [{"t": float(m), "step": None, "marker": m} for m in markers]
    return found


def test_a_run_cut_short_is_compared_over_the_steps_its_pair_also_ran() -> None:
    # The budget stopped the bad release at marker 6, inside a 32 MiB spike both releases
    # have at steps 5-6; the good one ran on to marker 9, after the spike was freed.
    spike_good = [0, 0, 0, 0, 32 * MIB, 32 * MIB, 0, 0, 0]
    good = marked((SPIKE, spike_good), markers=list(range(1, 10)))
    bad = marked((SPIKE, spike_good[:6]), (LEAK, [i * MIB for i in range(6)]),
                 markers=list(range(1, 7)))  # fmt: skip
    found = compare(good, bad, "leakyfixture", tracer="tracemalloc")
    assert [(s["site"], s["growth_bytes"]) for s in found["stacks"]] == [
        ("leakyfixture/__init__.py:22 in _touched", 4 * MIB)
    ]
    # Unaligned, the spike live at the bad run's end would be blamed first.
    unaligned = {**good, "snapshots": [{"t": 0.0}] * 9}
    assert [s["site"] for s in compare(unaligned, {**bad, "snapshots": [{"t": 0.0}] * 6},
                                       "leakyfixture", tracer="tracemalloc")["stacks"]] == [
        "leakyfixture/__init__.py:35 in step", "leakyfixture/__init__.py:22 in _touched"
    ]  # fmt: skip


def test_a_single_snapshot_is_never_cut() -> None:
    one = {"snapshots": [{"t": 9.0, "marker": 13}], "stacks": [{"frames": LEAK, "sizes": [MIB]}]}
    two = marked((LEAK, [0, MIB]), markers=[1, 5])
    assert attribution.aligned(one, two) == (one, two)


# --- which tracers run (rule 6) ---------------------------------------------------------


def test_tracemalloc_runs_only_when_memray_named_no_site() -> None:
    named = {"tracer": "memray", "available": True, "stacks": [{"site": "x"}]}
    assert attribution.python_tracer_needed(named) is False
    assert attribution.python_tracer_needed({**named, "stacks": []}) is True
    assert attribution.python_tracer_needed(attribution.unavailable("memray", "no wheel")) is True
    assert attribution.skipped("tracemalloc") == {
        "tracer": "tracemalloc", "available": False, "skipped": True, "stacks": [],
        "note": "not run: memray named the site (tracemalloc runs only when memray cannot)",
    }  # fmt: skip


# --- when a traced run stops (rules 7 and 8) --------------------------------------------


def test_the_markers_needed_follow_the_comparisons_arithmetic() -> None:
    assert attribution.markers_needed(40, 8.0) == 12  # 8 judged of 11 intervals
    assert attribution.markers_needed(60, 8.0) == 12
    assert attribution.markers_needed(1000, 8.0) == 188  # N/8 = 125 judged steps
    assert attribution.judged_intervals(188) == 125 and attribution.judged_intervals(187) == 124
    assert attribution.markers_needed(12, 8.0) is None  # as long as the run: to its end
    assert attribution.markers_needed(None, 8.0) is None  # no markers: the budget alone
    assert attribution.markers_needed(40, 0.0) is None  # no growth threshold to clear
    for steps in (14, 40, 60, 100, 333, 1000, 5000):
        for threshold in (1.0, 8.0, 50.0):
            markers = attribution.markers_needed(steps, threshold)
            if markers is None:
                continue
            # A leak that grew just the threshold over the run clears the noise floor 4x
            # over the judged steps, and never on fewer than eight of them.
            judged = attribution.judged_intervals(markers)
            assert judged * threshold * MIB / steps >= 4 * attribution.MIN_GROWTH_BYTES
            assert judged >= attribution.MIN_JUDGED_STEPS
            assert attribution.judged_intervals(markers - 1) < max(
                8, math.ceil(4 * attribution.MIN_GROWTH_BYTES * steps / (threshold * MIB))
            )  # the fewest that do


def test_the_budget_is_two_to_three_untraced_runs_within_half_the_search() -> None:
    budget = attribution.budget_s
    assert budget(10.0, search_s=1000.0, spent_s=0.0, ended=0) == 30.0  # 3x caps it
    assert budget(10.0, search_s=200.0, spent_s=0.0, ended=0) == 25.0  # 100 s over 4 runs
    # memray's two runs took 10 s: tracemalloc's two share the 90 s left.
    assert budget(10.0, search_s=200.0, spent_s=10.0, ended=2) == 30.0
    assert budget(10.0, search_s=200.0, spent_s=60.0, ended=2) == 20.0
    assert budget(10.0, search_s=40.0, spent_s=0.0, ended=0) == 20.0  # never below 2x
    assert budget(10.0, search_s=40.0, spent_s=40.0, ended=4) == 20.0
    assert budget(None, search_s=100.0, spent_s=0.0, ended=0) is None


def test_trace_stop_and_the_runners_hard_limit() -> None:
    stop = attribution.trace_stop(steps=60, untraced_s=15.5, min_growth_mib=8.0,
                                  search_s=210.0, spent_s=0.0, ended=0)  # fmt: skip
    assert stop == TraceStop(markers=12, seconds=31.0)  # 105 s over 4 runs < 2 x 15.5
    assert attribution.hard_timeout(stop, 600.0) == 122.0
    assert attribution.hard_timeout(stop, 90.0) == 90.0
    assert attribution.hard_timeout(TraceStop(), 600.0) == 600.0
    assert tracing.stop_args(stop) == ["12", "31.0"]
    assert tracing.stop_args(TraceStop(seconds=4.0)) == ["0", "4.0"]
    assert tracing.stop_args(TraceStop()) == tracing.stop_args(None) == []
    assert tracing.helper_args("memray", Path("/w/p.json"), Path("/w/r.py"), ["13", "26.2"]) == [
        "memray", "/w/p.json", "/w/r.py", "13", "26.2"
    ]  # fmt: skip
    # The Docker run phase passes them on to runners.docker.entry's `run`.
    kw = run_kwargs(DockerSettings(image="i", runner_name="r", cache_volume="c"), 1, 1,
                    python="/e/bin/python", script_name="repro.py", memory_limit_bytes=1 << 30,
                    variables={}, tracer="memray", stop=["13", "26.2"])  # fmt: skip
    assert kw["command"][-5:] == ["/e/bin/python", "/trial/work/repro.py", "memray", "13", "26.2"]


# --- how the runs ended (rule 9) --------------------------------------------------------


def test_how_a_run_ended_is_read_from_its_profile_and_nothing_else() -> None:
    cut = {"markers": 7, "limits": {"markers": 13, "seconds": 46.5},
           "stopped": {"by": "seconds", "markers": 7, "seconds": 46.6}}  # fmt: skip
    assert attribution.stop_of(cut) == {"by": "budget", "markers": 7, "seconds": 46.6,
                                        "budget_s": 46.5}  # fmt: skip
    assert attribution.stop_of({"markers": 40, "stopped": None}) == {
        "by": "end", "markers": 40, "seconds": None, "budget_s": None
    }  # fmt: skip
    forged = {"markers": True, "limits": {"seconds": "9"},
              "stopped": {"by": "rm -rf", "markers": -3, "seconds": float("inf")}}  # fmt: skip
    assert attribution.stop_of(forged) == {"by": "end", "markers": None, "seconds": None,
                                           "budget_s": None}  # fmt: skip
    assert attribution.stop_of({"error": "memray did not install: x"}) is None
    assert attribution.stop_of(None) is None


def test_a_tracer_cut_short_by_its_budget_says_so() -> None:
    cut = {"by": "budget", "markers": 7, "seconds": 46.6, "budget_s": 46.5}
    enough = {"by": "enough", "markers": 13, "seconds": 20.0, "budget_s": 46.5}
    said = attribution.stops({"good": enough, "bad": cut}, 60, {"good": 15.0, "bad": 15.5})
    assert (
        said["cut_short"]
        == "cut short after 7 of 60 steps (budget 3.0x the untraced run of 15.5 s)"
    )
    assert said["stopped"] == "stopped after 13 of 60 steps (enough to compare)"
    assert said["runs"] == {"good": enough, "bad": cut}
    # No markers: it says when; no untraced run known: the budget in seconds.
    timed = {"by": "budget", "markers": None, "seconds": 9.2, "budget_s": 9.0}
    assert attribution.stops({"good": timed, "bad": None}, None, {})["cut_short"] == (
        "cut short at 9 s (budget 9 s)"
    )
    ended = {"by": "end", "markers": 40, "seconds": None, "budget_s": None}
    assert attribution.stops({"good": ended, "bad": ended}, 40, {}) == {
        "runs": {"good": ended, "bad": ended}, "cut_short": None, "stopped": None
    }  # fmt: skip


# --- the helper's stops, in real child processes ----------------------------------------

LOOP = (
    "import threading, time\nkept = []\n"
    "def grow():\n    kept.append(bytearray(256 * 1024))\n"
    # A non-daemon thread: a stopped script must not keep the process alive for it.
    "threading.Thread(target=time.sleep, args=(60,)).start()\n"
    "for _ in range(400):\n    grow()\n    print('::leakbisect-step::', flush=True)\n"
    "    time.sleep(0.02)\n"
)


def traced(tmp_path: Path, *limits: str) -> tuple[subprocess.Popen[str], Path]:
    script = tmp_path / "repro.py"
    script.write_text(LOOP)
    out = tmp_path / "profile.json"
    command = [sys.executable, tracehelper.__file__, "tracemalloc", str(out), str(script), *limits]
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True), out  # fmt: skip


def finished(proc: subprocess.Popen[str], out: Path, read: str = "") -> dict:
    """The stopped helper's profile; `read`: what the test read of its stdout already."""
    stdout, stderr = proc.communicate(timeout=30)
    assert proc.returncode == 0, stderr
    assert not out.with_name(out.name + ".tmp").exists()
    written = json.loads(out.read_text())
    assert (read + stdout).count("::leakbisect-step::") == written["markers"]
    return written


def test_the_helper_stops_at_enough_markers_and_writes_a_whole_profile(tmp_path: Path) -> None:
    started = time.monotonic()
    written = finished(*traced(tmp_path, "13", "0"))
    assert time.monotonic() - started < 20  # not the 60 s thread, nor the 400 steps
    assert (written["markers"], written["limits"]) == (13, {"markers": 13, "seconds": None})
    assert written["stopped"]["by"] == "markers" and written["stopped"]["markers"] == 13
    markers = [s["marker"] for s in written["snapshots"]]
    assert markers[0] == 1 and markers[-1] == 13  # set-up dropped; its marker's snapshot last
    top = written["stacks"][0]
    assert top["frames"][-1] == ["repro.py", 4, "grow"]
    assert top["sizes"][-1] >= 13 * 256 * 1024
    assert attribution.stop_of(written)["by"] == "enough"


def test_the_helper_stops_at_its_budget(tmp_path: Path) -> None:
    written = finished(*traced(tmp_path, "0", "1.5"))
    assert written["stopped"]["by"] == "seconds"
    assert 1.5 <= written["stopped"]["seconds"] < 10
    assert 0 < written["markers"] < 400
    assert attribution.stop_of(written)["by"] == "budget"


def test_the_helper_stopped_by_sigterm_still_writes_its_profile(tmp_path: Path) -> None:
    proc, out = traced(tmp_path)
    assert proc.stdout is not None
    read = "".join(proc.stdout.readline() for _ in range(5))  # five markers are out
    proc.send_signal(signal.SIGTERM)
    written = finished(proc, out, read)
    assert written["stopped"]["by"] == "signal" and written["limits"] == {
        "markers": None, "seconds": None
    }  # fmt: skip
    assert written["stacks"][0]["frames"][-1] == ["repro.py", 4, "grow"]


def test_the_helper_refuses_limits_it_cannot_read(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, tracehelper.__file__, "tracemalloc", "o", "r.py",
                           "many", "0"], capture_output=True, text=True, timeout=30)  # fmt: skip
    assert proc.returncode == 2 and "MARKERS SECONDS" in proc.stderr


# --- the stage in the service: memray first, tracemalloc when it named nothing ----------

LEAKS_FROM = (1, 0, 6)
STEPS, UNTRACED_S = 60, 15.5


@pytest.fixture
def session(tmp_path: Path) -> Iterator[Session]:
    url = f"sqlite:///{tmp_path / 'stage.db'}"
    upgrade(url)
    with Session(make_engine(url)) as session:
        yield session


def stage_job(session: Session) -> Job:
    job = Job(package="leakyfixture", good="1.0.0", bad="1.0.9", script="pass",
              script_sha256="abc", constraints=["leakyfixture==1.0.0"],
              reuse_verdicts=False)  # fmt: skip
    session.add(job)
    session.flush()
    for position in range(10):
        session.add(Candidate(job_id=job.id, position=position, version=f"1.0.{position}"))
    session.commit()
    return job


def open_trials(session: Session, job: Job, kind: str) -> list[tuple[Trial, Candidate]]:
    query = (
        select(Trial, Candidate)
        .join(Candidate, col(Candidate.id) == Trial.candidate_id)
        .where(Trial.job_id == job.id, Trial.kind == kind, Trial.status == TrialStatus.QUEUED)
        .order_by(col(Trial.id))
    )
    return list(session.exec(query.execution_options(populate_existing=True)))


def search(session: Session, job: Job) -> None:
    """The release search to its end: every run 60 steps in 15.5 s, 1.0.6 on leaking."""
    advance(session, job, 1)
    while runs := open_trials(session, job, TrialKind.RUN):
        for trial, candidate in runs:
            leaks = tuple(map(int, candidate.version.split("."))) >= LEAKS_FROM
            trial.status, trial.exit_code, trial.duration_s = TrialStatus.DONE, 0, UNTRACED_S
            trial.verdict = "leak" if leaks else "clean"
            trial.analysis = {"growth_mib": 40.0 if leaks else 0.5, "step_count": STEPS}
            session.add(trial)
        session.commit()
        advance(session, job, 1)


def trace(session: Session, job: Job, profile: Callable[[str, bool, float], dict]) -> list:
    """Finish the queued traced runs with `profile(tracer, leaks, budget_s)` (5 s each, or
    none when it has an error: the tracer did not install); [(version, tracer, spec)]."""
    done = []
    everything = session.exec(select(Trial).where(Trial.job_id == job.id)).all()
    queued = open_trials(session, job, TrialKind.ATTRIBUTE)
    specs = [trial_spec(job, candidate, trial, everything) for trial, candidate in queued]
    for (trial, candidate), spec in zip(queued, specs, strict=True):
        leaks = tuple(map(int, candidate.version.split("."))) >= LEAKS_FROM
        assert spec.trace_stop is not None and spec.trace_stop.seconds is not None
        trial.profile = profile(trial.trace or "", leaks, spec.trace_stop.seconds)
        ran = not trial.profile.get("error")
        trial.status, trial.exit_code = TrialStatus.DONE, 0 if ran else None
        trial.duration_s = 5.0 if ran else 0.0
        session.add(trial)
        done.append((candidate.version, trial.trace, spec))
    session.commit()
    advance(session, job, 1)
    return done


def leak_profile(tracer: str, leaks: bool, budget: float, stopped: dict | None) -> dict[str, Any]:
    """Twelve markers' snapshots; a leaking release's line grows 1 MiB a step."""
    sizes = [i * MIB if leaks else 0 for i in range(12)]
    return {"tracer": tracer, "error": None, "markers": 12, "stopped": stopped,
            "limits": {"markers": 12, "seconds": budget},
            "snapshots": [{"t": float(i), "step": None, "marker": i + 1} for i in range(12)],
            "stacks": [{"frames": LEAK, "sizes": sizes}]}  # fmt: skip


def test_memray_goes_first_and_naming_the_site_spares_tracemalloc(session: Session) -> None:
    job = stage_job(session)
    search(session, job)
    enough = {"by": "markers", "markers": 12, "seconds": 8.0}
    traced = trace(session, job, lambda *run: leak_profile(*run, stopped=enough))
    assert [(version, tracer) for version, tracer, _ in traced] == [
        ("1.0.5", "memray"), ("1.0.6", "memray")
    ]  # fmt: skip
    # 60 steps in 15.5 s: 12 markers suffice; the search ran 8 x 15.5 s, so each of the
    # four traced runs the stage may take gets (124 / 2) / 4 = 15.5 s, raised to 2 x 15.5.
    assert [spec.trace_stop for _, _, spec in traced] == [TraceStop(markers=12, seconds=31.0)] * 2
    assert [spec.timeout_s for _, _, spec in traced] == [122.0] * 2
    assert open_trials(session, job, TrialKind.ATTRIBUTE) == []
    session.refresh(job)
    found = job.attribution or {}
    assert list(found["tracers"]) == ["memray", "tracemalloc"]
    memray, tracemalloc = found["tracers"]["memray"], found["tracers"]["tracemalloc"]
    assert [s["site"] for s in memray["stacks"]] == ["leakyfixture/__init__.py:22 in _touched"]
    assert (memray["cut_short"], memray["stopped"]) == (
        None, "stopped after 12 of 60 steps (enough to compare)"
    )  # fmt: skip
    assert tracemalloc == attribution.skipped("tracemalloc")
    assert found["message"] == (
        "grows at leakyfixture/__init__.py:22 in _touched (+8.0 MiB, memray)"
    )


def test_without_memray_tracemalloc_runs_within_what_is_left(session: Session) -> None:
    job = stage_job(session)
    search(session, job)
    failed = {"tracer": "memray", "error": "memray did not install: no wheel for this platform"}
    trace(session, job, lambda *run: failed)
    cut = {"by": "seconds", "markers": 7, "seconds": 31.1}
    traced = trace(session, job, lambda *run: leak_profile(*run, stopped=cut))
    assert [(version, tracer) for version, tracer, _ in traced] == [
        ("1.0.5", "tracemalloc"), ("1.0.6", "tracemalloc")
    ]  # fmt: skip
    # memray's runs ended at its install: tracemalloc's two share the stage's 62 s.
    assert [spec.trace_stop for _, _, spec in traced] == [TraceStop(markers=12, seconds=31.0)] * 2
    session.refresh(job)
    found = job.attribution or {}
    tracemalloc = found["tracers"]["tracemalloc"]
    assert (
        tracemalloc["cut_short"]
        == "cut short after 7 of 60 steps (budget 2.0x the untraced run of 15.5 s)"
    )
    assert tracemalloc["runs"]["bad"] == {
        "by": "budget",
        "markers": 7,
        "seconds": 31.1,
        "budget_s": 31.0,
    }
    assert found["tracers"]["memray"]["note"].startswith("memray did not install: no wheel")
    assert found["message"] == (
        "grows at leakyfixture/__init__.py:22 in _touched (+8.0 MiB, tracemalloc); "
        + tracemalloc["cut_short"]
    )


def test_the_reports_say_a_tracer_was_cut_short_or_not_run() -> None:
    # One wording for the text, Markdown and web reports (engine/findings.py).
    cut = "cut short after 7 of 60 steps (budget 3.0x the untraced run of 7.5 s)"
    enough = "stopped after 12 of 60 steps (enough to compare)"

    stack = {"site": "leakycodec/__init__.py:14 in step", "in_package": True,
             "growth_bytes": 9 * MIB, "frames": ["leakycodec/__init__.py:14 in step"]}  # fmt: skip
    found = {
        "package": "leakycodec", "last_good": "1.0.0", "first_bad": "1.0.1",
        "tracers": {
            "memray": {"note": "memray did not install: offline", "stacks": [], "seconds": {}},
            "tracemalloc": {
                "note": None, "stacks": [stack], "seconds": {"good": 22.4, "bad": 22.6},
                "cut_short": cut,
                "stopped": None,
            },
        },
    }  # fmt: skip
    assert attribution_lines(found)[1:] == [
        "memray: memray did not install: offline",
        "tracemalloc (good 22.4 s, bad 22.6 s): cut short after 7 of 60 steps (budget 3.0x the "
        "untraced run of 7.5 s)",
        "  +9.0 MiB  leakycodec/__init__.py:14 in step <- leakycodec",
    ]
    found["tracers"] = {
        "memray": {"note": None, "stacks": [stack], "seconds": {"good": 3.1, "bad": 3.3},
                   "cut_short": None, "stopped": enough},
        "tracemalloc": attribution.skipped("tracemalloc"),
    }  # fmt: skip
    assert attribution_lines(found)[1:] == [
        "memray (good 3.1 s, bad 3.3 s): stopped after 12 of 60 steps (enough to compare)",
        "  +9.0 MiB  leakycodec/__init__.py:14 in step <- leakycodec",
        "tracemalloc: not run: memray named the site (tracemalloc runs only when memray cannot)",
    ]


def test_the_first_bad_release_is_judged_from_the_step_the_last_good_one_is() -> None:
    # A 4 MiB cache fills over steps 1-8 in both releases. Under load the helper spaced
    # the good run's snapshots at markers 1, 7, 10, 13 and the bad run's at 1, 5, 9, 13: a
    # third of the way in is step 7 in one and step 5 in the other, and the cache's
    # 1.5 MiB from step 5 to 8 grew in the bad run only. Judged from step 7 in both, only
    # the leak (1 MiB a step in the bad release) counts.
    cache = lambda steps: [min(s, 8) * MIB // 2 for s in steps]  # noqa: E731
    good_steps, bad_steps = [1, 7, 10, 13], [1, 5, 9, 13]
    good = marked((CACHE, cache(good_steps)), markers=good_steps)
    bad = marked((CACHE, cache(bad_steps)), (LEAK, [s * MIB for s in bad_steps]),
                 markers=bad_steps)  # fmt: skip
    found = compare(good, bad, "leakyfixture", tracer="tracemalloc")
    assert [(s["site"], s["growth_bytes"]) for s in found["stacks"]] == [
        ("leakyfixture/__init__.py:22 in _touched", 4 * MIB)
    ]
    # Each judged from its own third, the cache is blamed as well.
    before, after = growth(good), growth(bad)
    key = tuple((f, n, fn) for f, n, fn in CACHE)
    assert (after[key][0], before[key][0]) == (int(1.5 * MIB), MIB // 2)


def test_a_stalled_run_with_one_snapshot_in_the_window_is_judged_from_the_one_before() -> None:
    # CI, loaded: the good run's snapshots at markers 1, 5, 9, 12 (judged from 5), the bad
    # run's at 1, 3, 12 (a stall spaced them). From marker 5 on the bad run has only its
    # last snapshot, which grows by nothing: the leak was reported as 0.0 MiB explained.
    good_steps, bad_steps = [1, 5, 9, 12], [1, 3, 12]
    good = marked((HELPER, [MIB] * 4), markers=good_steps)
    bad = marked((HELPER, [MIB] * 3), (LEAK, [s * MIB for s in bad_steps]), markers=bad_steps)
    found = compare(good, bad, "leakyfixture", tracer="tracemalloc", rss_growth_bytes=9 * MIB)
    assert [(s["site"], s["growth_bytes"]) for s in found["stacks"]] == [
        ("leakyfixture/__init__.py:22 in _touched", 9 * MIB)
    ]
    assert "native" not in (found.get("note") or ""), found


def test_snapshots_are_spaced_by_their_cpu_time_not_the_wall_clock(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A snapshot descheduled for 0.3 s of wall time on a loaded machine cost 1 ms of CPU:
    # the next one is due after MIN_GAP_S, not five times 0.3 s.
    limits = tracehelper.Limits()
    limits.t0 = 0.0
    walls, cpus = iter([0.0, 0.3]), iter([5.0, 5.001])
    monkeypatch.setattr(tracehelper.time, "monotonic", lambda: next(walls, 0.3))
    monkeypatch.setattr(tracehelper.time, "thread_time", lambda: next(cpus, 5.001))
    snaps = tracehelper.Snapshots(tracehelper.__file__, limits)
    tracemalloc.start()
    try:
        snaps.take(None, force=True, marker=1)
    finally:
        tracemalloc.stop()
    assert snaps.gap == tracehelper.MIN_GAP_S
    assert len(snaps.taken) == 1
