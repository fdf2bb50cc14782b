"""`bisect-cli run`: the whole flow in one process, one trial at a time or N side by side.

The job is a local one (`Job.local`): this process leases its trials itself
(`queue.claim_local`), so a `bisect-cli serve` sharing the database never runs or
advances it. An infrastructure failure (`TrialReport.infrastructure`) is handled exactly
as the API handles a runner's (service/queue.py, infrastructure rules): tried again, here
on the same machine, and the job ends naming the cause when it persists; a full disk
raised in this process (``ENOSPC``) is one too.
"""

import threading
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Protocol

from sqlmodel import Session

from contract.errors import InfrastructureFailure
from contract.executor import Executor, Kill
from contract.wire import EnvResult, Failure, Sample, TrialReport, TrialSpec
from engine.verdicts import Verdict
from service import kinds, queue, store
from service.models import Candidate, Job, JobStatus, Trial, TrialStatus
from service.scheduler import advance, cancel
from service.specs import trial_spec
from service.trials import record_report


class TrialEvents(Protocol):
    """What a local run tells its display as it goes."""

    def trial_started(self, candidate: Candidate, trial: Trial, spec: TrialSpec) -> None: ...
    def sample(self, sample: Sample) -> None: ...
    def trial_finished(self, candidate: Candidate, trial: Trial, verdict: Verdict) -> None: ...
    def message(self, text: str) -> None: ...


@dataclass
class Quiet:
    """Events that are only recorded; used by tests and `--json` pipes."""

    visited: list[str] = field(default_factory=list)

    def trial_started(self, candidate: Candidate, trial: Trial, spec: TrialSpec) -> None:
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
    jobs: int = 1,
    memory_budget: int | None = None,
    operator_webhook: bool = False,
) -> Job:
    """Run the job to its end, up to `jobs` trials side by side (`bisect-cli run --jobs N`).

    The trials run in worker threads, each a capped child process of its own; the database
    is only touched from this thread. With several slots the planner cuts the range into
    that many parts (k-section), and a trial with no memory limit of its own gets the
    default cap (`memory_budget`, the runner's: `runners.limits.default_limit_bytes`, which
    the caller measures) divided among the slots, so that N capped trials together stay
    under it. `operator_webhook`: BISECT_WEBHOOK_URL is set, so the job's end is posted there
    too (the caller sends its webhooks: service/webhooks.py `deliver_job`).
    """
    progress = progress or Quiet()
    trials = _Running(executor, jobs, log, progress.sample if jobs == 1 else None)
    trials.say = progress.message
    try:
        with trials:
            while True:
                advance(session, job, slots=jobs, operator_webhook=operator_webhook)
                if JobStatus(job.status).finished:
                    return job
                _fill(session, job, trials, progress, memory_budget)
                if not trials.busy():
                    raise RuntimeError(f"job {job.id} is running but has no queued trial")
                for candidate, trial, report in trials.finished():
                    verdict = record_report(session, job, candidate, trial, report)
                    if verdict is not None:
                        progress.trial_finished(candidate, trial, verdict)
                    elif (failure := report.infrastructure) is not None:
                        progress.message(_infrastructure_line(candidate, trial, failure))
    except BaseException:
        # An interrupted run leaves a cancelled job, not one that looks alive forever.
        session.rollback()
        cancel(session, job, "interrupted", operator_webhook=operator_webhook)
        raise


def _infrastructure_line(candidate: Candidate, trial: Trial, failure: Failure) -> str:
    """What the display says of an infrastructure failure (service/queue.py's rules decide
    what follows: another try, or the job's end, which the report then names)."""
    tries = f"{len(trial.infra_failures)} of {queue.INFRA_TRIES}"
    again = "trying again" if trial.status == TrialStatus.QUEUED else "giving up"
    return f"{candidate.version}: infrastructure failure ({tries}), {again}: {failure.message}"


def _fill(
    session: Session, job: Job, trials: "_Running", progress: TrialEvents, budget: int | None
) -> None:
    """Lease queued trials to this process while slots are free, and start them."""
    while trials.free() and (trial := queue.claim_local(session, job)) is not None:
        candidate = session.get(Candidate, trial.candidate_id)
        assert candidate is not None
        spec = trial_spec(job, candidate, trial, store.trials_of(session, job))
        # A run is a trial of the display's own; any other kind says what it does.
        if (line := kinds.handler(trial.kind).started(job, candidate, trial)) is None:
            progress.trial_started(candidate, trial, spec)  # its early stop: the status line's
        else:
            progress.message(line)
        trials.start(candidate, trial, _capped(spec, trials.slots, budget))


def _capped(spec: TrialSpec, slots: int, budget: int | None) -> TrialSpec:
    if slots == 1 or spec.memory_limit_bytes is not None or budget is None:
        return spec
    return spec.model_copy(update={"memory_limit_bytes": budget // slots})


class _Running:
    """Trials running in worker threads; leaving it kills whatever still runs."""

    def __init__(
        self,
        executor: Executor,
        slots: int,
        log: Callable[[str], None] | None,
        on_sample: Callable[[Sample], None] | None,
    ) -> None:
        self.executor, self.slots, self.log, self.on_sample = executor, slots, log, on_sample
        self.pool = ThreadPoolExecutor(max_workers=slots, thread_name_prefix="trial")
        self.futures: dict[Future[TrialReport], tuple[Candidate, Trial, TrialSpec]] = {}
        self.kills: dict[int | None, Kill] = {}
        self.stopping = threading.Event()
        self.say: Callable[[str], None] = log or (lambda _text: None)

    def free(self) -> bool:
        return len(self.futures) < self.slots

    def busy(self) -> bool:
        return bool(self.futures)

    def start(self, candidate: Candidate, trial: Trial, spec: TrialSpec) -> None:
        def started(kill: Kill, key: int | None = trial.id) -> None:
            self.kills[key] = kill
            if self.stopping.is_set():  # interrupted while it was still building
                kill()

        future = self.pool.submit(
            self.executor.run_trial, spec, on_sample=self.on_sample, on_start=started, log=self.log
        )
        self.futures[future] = (candidate, trial, spec)

    def finished(self) -> list[tuple[Candidate, Trial, TrialReport]]:
        """Wait for at least one trial to end; those that ended, in the order they started.

        One whose machine failed under it (`InfrastructureFailure`: a Slurm node) has no
        outcome: it is started again, as the API queues it again for a runner."""
        done, _ = wait(self.futures, return_when=FIRST_COMPLETED)
        out = []
        for future in [f for f in self.futures if f in done]:
            candidate, trial, spec = self.futures.pop(future)
            self.kills.pop(trial.id, None)
            try:
                out.append((candidate, trial, future.result()))
            except InfrastructureFailure as exc:
                self.say(f"trial {trial.id}: {exc}; starting it again")
                self.start(candidate, trial, spec)
            except OSError as exc:  # a full disk is the infrastructure's, as on a runner
                if (failure := Failure.from_exception(exc)) is None:
                    raise
                env = EnvResult(ok=True)
                report = TrialReport(trial_id=spec.trial_id, attempt=spec.attempt, env=env,
                                     error=failure.message, failure=failure)  # fmt: skip
                out.append((candidate, trial, report))
        return out

    def __enter__(self) -> "_Running":
        return self

    def __exit__(self, *exc: object) -> None:
        self.stopping.set()
        for kill in list(self.kills.values()):
            kill()
        self.pool.shutdown(wait=True, cancel_futures=True)


__all__ = ["Quiet", "TrialEvents", "run_job"]
