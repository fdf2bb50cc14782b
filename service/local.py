"""`bisect-cli run`: the whole flow in one process, one trial at a time."""

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from sqlmodel import Session, col, select

from runners.trial import Executor
from runners.wire import Sample
from service.models import Candidate, Job, JobStatus, Trial, TrialStatus, utcnow
from service.scheduler import advance, cancel, candidates_of
from service.trials import record_report, trial_spec
from service.verdicts import Verdict


class Progress(Protocol):
    def trial_started(self, candidate: Candidate, trial: Trial) -> None: ...
    def sample(self, sample: Sample) -> None: ...
    def trial_finished(self, candidate: Candidate, trial: Trial, verdict: Verdict) -> None: ...
    def message(self, text: str) -> None: ...


@dataclass
class Quiet:
    """A progress sink that records what happened; used by tests and `--json` pipes."""

    visited: list[str] = field(default_factory=list)

    def trial_started(self, candidate: Candidate, trial: Trial) -> None:
        self.visited.append(candidate.version)

    def sample(self, sample: Sample) -> None:
        pass

    def trial_finished(self, candidate: Candidate, trial: Trial, verdict: Verdict) -> None:
        pass

    def message(self, text: str) -> None:
        pass


def _next_trial(session: Session, job: Job) -> Trial | None:
    query = (
        select(Trial)
        .where(Trial.job_id == job.id, col(Trial.status) == TrialStatus.QUEUED)
        .order_by(col(Trial.id))
    )
    return session.exec(query).first()


def run_job(
    session: Session,
    job: Job,
    *,
    executor: Executor,
    progress: Progress | None = None,
    log: Callable[[str], None] | None = None,
) -> Job:
    progress = progress or Quiet()
    try:
        while True:
            advance(session, job, slots=1)
            if JobStatus(job.status).finished:
                return job
            trial = _next_trial(session, job)
            if trial is None:
                raise RuntimeError(f"job {job.id} is running but has no queued trial")
            candidate = session.get(Candidate, trial.candidate_id)
            assert candidate is not None
            trial.status = TrialStatus.LEASED
            trial.runner_id = "local"
            trial.attempt += 1
            trial.started_at = utcnow()
            session.add(trial)
            session.commit()
            progress.trial_started(candidate, trial)
            report = executor.run_trial(
                trial_spec(job, candidate, trial), on_sample=progress.sample, log=log
            )
            verdict = record_report(session, job, candidate, trial, report)
            progress.trial_finished(candidate, trial, verdict)
    except BaseException:
        # An interrupted run leaves a cancelled job, not one that looks alive forever.
        session.rollback()
        cancel(session, job, "interrupted")
        raise


__all__ = ["Progress", "Quiet", "candidates_of", "run_job"]
