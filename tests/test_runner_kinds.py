"""The runner's one handler per trial kind (runners/kinds.py) and the one watch loop
(runners/watch.py) with a fake sample source: pure, fast."""

from __future__ import annotations

import threading
import time

import pytest

from contract.wire import CommitRange, EnvSpec, Sample, TrialKind, TrialSpec
from runners.kinds import HANDLERS, PHASES, Ready, handler
from runners.watch import Output, Readings, WatchArgs, watch

ENV = EnvSpec(package="p", version="1")


def _spec(kind: TrialKind, **kw: object) -> TrialSpec:
    return TrialSpec(trial_id=1, attempt=1, kind=kind, env=ENV, script="", **kw)


def test_every_kind_has_one_handler_and_every_build_phase_a_name() -> None:
    assert set(HANDLERS) == set(TrialKind)
    assert {h.phase.name for h in HANDLERS.values()} == set(PHASES) == {"build", "resolve",
                                                                        "commits"}  # fmt: skip
    assert [k for k in TrialKind if handler(k).runs_script] == [TrialKind.RUN,
                                                                TrialKind.ATTRIBUTE]  # fmt: skip


def test_what_each_build_phase_is_given_and_its_answer_settles() -> None:
    r = CommitRange(repo="https://example.org/r.git", package="p", good="1", bad="2")
    assert handler("commits").given(ENV, r) is r and handler("resolve").given(ENV, r) is ENV
    memray = _spec(TrialKind.ATTRIBUTE, trace="memray")
    assert "memray" in handler(memray.kind).env(memray).requirements
    assert "memray" not in handler("run").env(_spec(TrialKind.RUN, trace="memray")).requirements
    ready = handler("attribute").settle(memray, {"ok": True, "python_executable": "/py"})
    assert ready == Ready(ready.env, "/py", "memray")  # type: ignore[union-attr]
    failed = handler("attribute").settle(memray, {"error": "memray: no wheel", "seconds": 2})
    assert failed.attribution["tracer"] == "memray"  # type: ignore[union-attr,index]
    pins = handler("resolve").settle(_spec(TrialKind.RESOLVE), {"pins": ["a==1"], "seconds": 1})
    assert (pins.pins, pins.env.ok, pins.env.seconds) == (["a==1"], True, 1.0)  # type: ignore[union-attr]


class _Source:
    """Samples 1 MiB more each time; ends after `end_after` samples (None: never)."""

    def __init__(self, end_after: int | None = None) -> None:
        self.n, self.end_after, self.stopped = 0, end_after, False
        self.ended = threading.Event()

    def sample(self, t: float, step: int | None) -> Sample | None:
        self.n += 1
        if self.end_after is not None and self.n >= self.end_after:
            self.ended.set()
        return Sample(t=t, rss=self.n << 20, step=step)

    def wait_end(self, timeout: float) -> bool:
        return self.ended.wait(timeout)

    def stop(self) -> None:
        self.stopped = True
        self.ended.set()


@pytest.mark.parametrize(("end_after", "timed_out"), [(3, False), (None, True)])
def test_the_loop_ends_at_the_run_end_or_its_deadline(end_after: int | None, timed_out: bool
                                                      ) -> None:  # fmt: skip
    source, t0 = _Source(end_after), time.monotonic()
    readings = Readings(source, WatchArgs(t0=t0, deadline=t0 + 0.3, sample_hz=10.0,
                                          memory_limit_bytes=1 << 30))  # fmt: skip
    seen = watch(readings, Output(t0, on_marker=readings.at_marker))
    assert (seen.timed_out, source.stopped, seen.stopped_early) == (timed_out, timed_out, None)
    # 100 Hz for the first seconds: the deadline run took about 30 samples, not 3.
    assert len(seen.samples) == 3 if end_after else len(seen.samples) >= 10
    assert [s.rss for s in seen.samples] == [(i + 1) << 20 for i in range(len(seen.samples))]
