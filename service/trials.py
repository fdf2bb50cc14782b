"""Trials: how a runner's report is stored and judged (what it is told: service/specs.py).

`record_report` first asks whether the report is an infrastructure failure
(`TrialReport.infrastructure`, a `contract.wire.Cause` the runner decided): then it is no
outcome of the release, of any kind of trial, and the queue retries it or finishes it
(service/queue.py, infrastructure rules; the scheduler ends the job on one that persists,
`infrastructure_stop` its words). Otherwise it asks the trial's kind (service/kinds.py)
once what its report holds: a judged run, a traced run, or an answer (pins, commits) from
a trial that ran no script.

A skip says which (`skip_why`, what a skipped bound's message says): the script's own exit
125, uv's "no resolution", no wheel or sdist for the platform, a release that did not
build, the repro that cannot run on the release, or an environment that could not be
built for a reason the runner did not classify (a runner from before causes).
"""

from typing import Any

from sqlalchemy import insert
from sqlmodel import Session

from contract.floors import steps_done
from contract.wire import Cause, EnvResult, TrialReport
from engine import crash
from engine.analysis import SKIP_EXIT_CODE, ClassifierSettings, classify_run
from engine.verdicts import Verdict
from service import kinds, pins, queue
from service.models import Candidate, Job, MemorySample, Trial, TrialStatus, utcnow

SAMPLE_FIELDS = {"t", "rss", "anon", "shared", "gpu", "step"}


def classifier_settings(job: Job) -> ClassifierSettings:
    return ClassifierSettings(**job.classifier)


Judgement = tuple[Verdict, dict[str, Any]]


def judge(job: Job, report: TrialReport) -> Judgement:
    """The verdict and analysis of a run trial's report. Pure (no session, no lock): the API
    calls it before it locks the trial (service/queue.py, Concurrency)."""
    env = report.env
    if not env.ok:
        # An environment that cannot be built makes the release untestable, never guilty.
        # (One the infrastructure failed is no outcome at all: `record_report`.)
        return Verdict.SKIP, {"reason": f"environment failed: {env.error}", **_unbuilt(env)}
    if report.error and report.exit_code is None:
        return Verdict.ERROR, {"reason": report.error}
    if (line := _cannot_run(report)) is not None:
        # Not guilty and not innocent: the release lacks what the repro uses. A skip, which
        # the planner steps around (at a bound it says so: `cannot_run_why`).
        reason = f"the repro cannot run on this release ({line})"
        return Verdict.SKIP, {"verdict": "skip", "reason": reason, "cannot_run": line}
    samples = report.samples
    gpu = [s.gpu for s in samples] if report.gpu_source != "unavailable" else None
    run = classify_run(
        [s.t for s in samples],
        [s.rss for s in samples],
        gpu,
        report.steps,
        exit_code=report.exit_code,
        oom_killed=report.oom_killed,
        timed_out=report.timed_out,
        settings=classifier_settings(job),
    )
    analysis = run.to_dict()
    analysis["growth_mib"] = _headline_growth(run.to_dict())
    # How many steps it ran: the early-stop horizon of later trials (service/specs.py).
    analysis["step_count"] = steps_done(report.steps) or None
    analysis["stopped_early"] = report.stopped_early
    # The horizon the run was judged against and the leak looks it tested (None: the trial
    # had no early-stop settings); verdict reuse reads it (service/reuse.py).
    analysis["early_stop"] = None if report.early_stop is None else report.early_stop.model_dump()
    # The isolation it ran without (runners/shim.py PROTECTIONS): the report's environment
    # line says it once per job (service/report.py missing_protections).
    analysis["missing_protections"] = list(report.missing_protections)
    verdict = run.verdict
    if verdict is Verdict.SKIP and report.exit_code == SKIP_EXIT_CODE:
        analysis |= _skipped(Cause.SCRIPT_SKIP, "")
    if report.stopped_early and not report.oom_killed:
        # The runner ended it because its rule was sure it leaks (contract/earlystop.py);
        # the samples say why, cut off where the rule fired.
        verdict = Verdict.LEAK
        analysis["verdict"] = verdict.value
        analysis["reason"] = f"stopped early: {report.stopped_early}"
    return verdict, analysis


def _cannot_run(report: TrialReport) -> str | None:
    """The error line of a run that ended itself with an ImportError, ModuleNotFoundError
    or AttributeError before its first step marker (engine/crash.py); else None. What it
    did before (an import ramp) is set-up, never a leak; after a marker the crash is what
    it is today (an error, or a leak by `crash_leak_is_leak`)."""
    killed = report.oom_killed or report.timed_out or report.stopped_early
    if report.exit_code in (None, 0, 125) or killed or report.steps:
        return None
    return crash.cannot_run(report.log_tail)


def cannot_run_why(analysis: dict[str, Any] | None) -> str | None:
    """A skipped run's reason worded for the planner's bounds message, when the repro
    could not run on the release; else None."""
    line = (analysis or {}).get("cannot_run")
    return f"the repro cannot run on it ({line})" if line else None


def skip_why(analysis: dict[str, Any] | None) -> str | None:
    """Why a run was skipped, worded to follow the planner's "cannot be tested: " (which
    of the module docstring's reasons); None for a run that was no skip, or one stored
    before skips said which."""
    return cannot_run_why(analysis) or (analysis or {}).get("skipped")


# What each cause of a skip makes a skipped bound's message say (`skip_why`); the release's
# own causes end with uv's line, the script's exit 125 says it alone.
_SKIPPED = {
    Cause.SCRIPT_SKIP: "its script exited 125 (the script's own skip: it cannot test it)",
    Cause.NO_RESOLUTION: "uv found no resolution: {}",
    Cause.NO_DISTRIBUTION: "it has no wheel or sdist for the platform: {}",
    Cause.BUILD_FAILED: "it did not build: {}",
}


def _skipped(cause: Cause | None, line: str) -> dict[str, Any]:
    """The analysis keys of a skip: its cause (None: not classified) and `skip_why`'s words."""
    if cause is None or cause not in _SKIPPED:
        return {"cause": None, "skipped": f"its environment could not be built: {line}"}
    return {"cause": cause.value, "skipped": _SKIPPED[cause].format(line)}


def _unbuilt(env: EnvResult) -> dict[str, Any]:
    """`_skipped` for a failed build of the release's (not the infrastructure's)."""
    failure = env.failure
    line = failure.message if failure is not None else env.error or "no reason given"
    return _skipped(failure.cause if failure is not None else None, _one_line(line))


def _one_line(text: str) -> str:
    return " ".join(text.split())


def ending_failure(trials: list[Trial]) -> Trial | None:
    """The trial whose infrastructure failures end its job (service/queue.py
    `infrastructure_spent`), if any. A traced run is never a verdict: one the
    infrastructure failed ends its tracing alone (its error says why), and the answer
    found before it stands."""
    deciding = (t for t in trials if not kinds.handler(t.kind).traced)
    return next((t for t in deciding if queue.infrastructure_spent(t)), None)


def infrastructure_stop(trial: Trial, candidate: Candidate, package: str) -> str:
    """The job's message when `trial` ended on its infrastructure failures (service/queue.py
    `infrastructure_spent`): which release, how often, on how many runners, and the last
    failure's own line (the host and the rule that refused it, where it was a refusal)."""
    failures = trial.infra_failures or []
    runners = len({f.get("runner") for f in failures})
    on = f" on {runners} runners" if runners > 1 else ""
    last = _one_line(str(failures[-1].get("message") if failures else trial.error))
    return (
        f"stopped by an infrastructure failure, not a verdict of any release: "
        f"{package} {candidate.version} failed {len(failures)} times{on}: {last}"
    )


def record_report(
    session: Session,
    job: Job,
    candidate: Candidate,
    trial: Trial,
    report: TrialReport,
    judged: Judgement | None = None,
) -> Verdict | None:
    """Store a runner's report with its samples and the classifier's verdict (None for a
    kind that is no judged run: service/kinds.py, and for an infrastructure failure, which
    the queue retries: the module docstring). `judged`: `judge(job, report)`, computed
    beforehand by a caller that holds a lock now; else it is computed here. The trial is
    leased (its lease checked by the caller: the API's `lock_for_report`)."""
    if (failure := report.infrastructure) is not None:
        queue.infrastructure_failed(session, trial, failure.model_dump(mode="json"))
        return None
    kind = kinds.handler(trial.kind)
    if not kind.runs_script:
        _record_answer(session, job, trial, report, kind)
        return None
    verdict, analysis = judged or judge(job, report)
    _record_ending(trial, report)
    if kind.traced:
        _record_traced(session, trial, report, verdict, analysis)
        return None
    env = report.env
    candidate.freeze = env.freeze or candidate.freeze
    candidate.resolution = env.resolution if env.ok else candidate.resolution
    candidate.resolution_note = env.resolution_note or env.error
    candidate.env_seconds = env.seconds

    trial.verdict = verdict.value
    trial.analysis = analysis
    _store_samples(session, trial, report)
    session.add(trial)
    session.add(candidate)
    session.commit()
    return verdict


def _record_ending(trial: Trial, report: TrialReport) -> None:
    """How a trial that ran the script ended, as its report says."""
    trial.status = TrialStatus.DONE
    trial.finished_at = utcnow()
    trial.exit_code = report.exit_code
    trial.oom_killed = report.oom_killed
    trial.timed_out = report.timed_out
    trial.cap_method = report.cap_method
    trial.duration_s = report.duration_s
    trial.env_seconds = report.env.seconds
    trial.log_tail = report.log_tail
    trial.gpu_source = report.gpu_source
    trial.error = report.error


def _record_traced(
    session: Session, trial: Trial, report: TrialReport, verdict: Verdict, analysis: dict[str, Any]
) -> None:
    """A traced run: its profile and memory are kept, its verdict never decides (tracing
    perturbs timing); its environment has the tracer added, so it is not the candidate's."""
    env = report.env
    trial.profile = report.attribution
    trial.error = report.error or (None if env.ok else env.error)
    # Its growth: what tracemalloc's stacks must explain.
    trial.analysis = {"growth_mib": analysis.get("growth_mib"), "verdict": verdict.value}
    _store_samples(session, trial, report)
    session.add(trial)
    session.commit()


def _store_samples(session: Session, trial: Trial, report: TrialReport) -> None:
    if report.samples:
        # One executemany, not an ORM object per sample: a trial uploads thousands.
        rows = [
            {"trial_id": trial.id, **s.model_dump(include=SAMPLE_FIELDS)} for s in report.samples
        ]
        session.execute(insert(MemorySample), rows)


def _record_answer(
    session: Session, job: Job, trial: Trial, report: TrialReport, kind: kinds.Kind
) -> None:
    """A trial that ran no script: what it answered (the job's pins, or the commits the
    commit stage reads), or why it could not; no samples, no verdict."""
    trial.status = TrialStatus.DONE
    trial.finished_at = utcnow()
    trial.env_seconds = report.env.seconds
    trial.error = None if report.env.ok else report.env.error
    if kind.resolves:
        pins.record(job, report)
        session.add(job)
    if kind.lists_commits:
        trial.commits = None if report.commits is None else [c.model_dump() for c in report.commits]
    session.add(trial)
    session.commit()


def _headline_growth(run: dict) -> float | None:
    """The larger of host and GPU floor growth: the figure a report leads with."""
    figures = [
        series["growth_mib"]
        for series in (run.get("host"), run.get("gpu"))
        if series and series.get("growth_mib") is not None
    ]
    return max(figures) if figures else None
