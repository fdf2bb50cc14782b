"""`bisect-cli run`: the whole flow in one process, one trial at a time.

The job is a local one (`Job.local`): this process leases its trials itself
(`queue.claim_local`), so a `bisect-cli serve` sharing the database never runs or
advances it.
"""

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from sqlmodel import Session

from runners.trial import Executor
from runners.wire import Sample
from service import queue
from service.models import Candidate, Job, JobStatus, Trial, TrialKind
from service.scheduler import advance, cancel
from service.specs import trial_spec
from service.trials import record_report
from service.verdicts import Verdict


class TrialEvents(Protocol):
    """What a local run tells its display as it goes."""

    def trial_started(self, candidate: Candidate, trial: Trial) -> None: ...
    def sample(self, sample: Sample) -> None: ...
    def trial_finished(self, candidate: Candidate, trial: Trial, verdict: Verdict) -> None: ...
    def message(self, text: str) -> None: ...


@dataclass
class Quiet:
    """Events that are only recorded; used by tests and `--json` pipes."""

    visited: list[str] = field(default_factory=list)

    def trial_started(self, candidate: Candidate, trial: Trial) -> None:
        self.visited.append(candidate.version)

    def sample(self, sample: Sample) -> None:
        pass

    def trial_finished(self, candidate: Candidate, trial: Trial, verdict: Verdict) -> None:
        pass

    def message(self, text: str) -> None:
        pass


def run_job(
    session: Session,
    job: Job,
    *,
    executor: Executor,
    progress: TrialEvents | None = None,
    log: Callable[[str], None] | None = None,
) -> Job:
    progress = progress or Quiet()
    try:
        while True:
            advance(session, job, slots=1)
            if JobStatus(job.status).finished:
                return job
            trial = queue.claim_local(session, job)
            if trial is None:
                raise RuntimeError(f"job {job.id} is running but has no queued trial")
            candidate = session.get(Candidate, trial.candidate_id)
            assert candidate is not None
            if trial.kind == TrialKind.RUN:
                progress.trial_started(candidate, trial)
            else:
                progress.message(f"resolving the pins of {job.package}=={candidate.version}")
            report = executor.run_trial(
                trial_spec(job, candidate, trial), on_sample=progress.sample, log=log
            )
            verdict = record_report(session, job, candidate, trial, report)
            if verdict is not None:
                progress.trial_finished(candidate, trial, verdict)
    except BaseException:
        # An interrupted run leaves a cancelled job, not one that looks alive forever.
        session.rollback()
        cancel(session, job, "interrupted")
        raise


__all__ = ["Quiet", "TrialEvents", "run_job"]
