"""A job as its readers see it: the read models the API, the status page and the CLI show.

Every adapter reads jobs through these functions, so a job reads the same wherever it is
shown: `GET /jobs/{id}`, the page, `bisect-cli status` on a server or on the local results
database. Rules:

- A caller sees a job only if `Caller.may_read` its owner (service/access.py); another
  token's job or trial is as good as absent (`JobNotFound`/`TrialNotFound`, 404).
- A job's progress is defined once, here (`progress_of`): its releases (the candidates of
  stage `RELEASES`, service/stages.py), how many have a verdict, and its runs of the script (trials
  of kind run; resolve trials are not runs) done, running (leased) and queued. Grouped
  queries, so the list counts a page of jobs as cheaply as the report counts one.
- A running trial (`running_trials`) is shown as its status line shows it: its runner's last
  heartbeat (memory, steps, floors), its time since it was leased by the server's clock, and
  the early-stop state in words (contract/earlystop.py `live_state`) of the settings it was
  sent: the job's runs that had ended when it was leased give its horizon (service/specs.py).
- Reads only: nothing here writes (service/actions.py changes jobs).
"""

from collections.abc import Sequence

from sqlalchemy import case, func
from sqlmodel import Session, col, select

from contract.earlystop import live_state
from service import kinds, specs, stages, store
from service.access import Caller
from service.markdown import markdown_report
from service.models import Candidate, Job, Trial, TrialStatus, WebhookDelivery, utcnow
from service.report import build_report, links, with_progress
from service.schemas import (
    JobPublic,
    JobSummary,
    Progress,
    Report,
    RunningTrial,
    TrialPublic,
    WebhookAttempt,
    WebhookDeliveryPublic,
)
from service.state import dump

# What progress counts: the job's releases, and its runs of the script (kinds.JUDGED).
_RELEASES = col(Candidate.stage) == stages.RELEASES


def readable_job(session: Session, job_id: int, caller: Caller) -> Job:
    """The job, if this caller may see it; another token's job is as good as absent (404)."""
    job = store.job(session, job_id)
    if not caller.may_read(job.owner):
        raise store.JobNotFound(f"job {job_id} not found")
    return job


def readable_trial(session: Session, trial_id: int, caller: Caller) -> Trial:
    """The trial, if this caller may see its job (404 otherwise)."""
    trial = store.trial(session, trial_id)
    job = session.get(Job, trial.job_id)
    if job is None or not caller.may_read(job.owner):
        raise store.TrialNotFound(f"trial {trial_id} not found")
    return trial


def progress_of(session: Session, ids: list[int]) -> dict[int, Progress]:
    """Where each job stands (counts only: `running` is empty), in two grouped queries."""
    out = {i: Progress(candidates=0, judged=0, trials_done=0, trials_running=0, trials_queued=0)
           for i in ids}  # fmt: skip
    if not ids:
        return out
    judged = func.sum(case((col(Candidate.verdict).is_not(None), 1), else_=0))
    releases = session.exec(
        select(Candidate.job_id, judged, func.count())
        .where(col(Candidate.job_id).in_(ids), _RELEASES)
        .group_by(col(Candidate.job_id))
    )
    for job_id, j, n in releases:
        out[job_id].judged, out[job_id].candidates = int(j or 0), int(n)
    runs = session.exec(
        select(Trial.job_id, Trial.status, func.count())
        .where(col(Trial.job_id).in_(ids), kinds.JUDGED)
        .group_by(col(Trial.job_id), col(Trial.status))
    )
    field = {
        TrialStatus.DONE: "trials_done",
        TrialStatus.LEASED: "trials_running",
        TrialStatus.QUEUED: "trials_queued",
    }
    for job_id, status, n in runs:
        if (name := field.get(TrialStatus(status))) is not None:
            setattr(out[job_id], name, int(n))
    return out


def running_trials(session: Session, job: Job, trials: Sequence[Trial]) -> list[RunningTrial]:
    """The job's runs that a runner holds now (the ones `trials_running` counts), in the
    order they were queued; `trials`: all of the job's (their early-stop settings)."""
    rows = session.exec(
        select(Trial, Candidate.version)
        .join(Candidate, col(Candidate.id) == col(Trial.candidate_id))
        .where(Trial.job_id == job.id, kinds.JUDGED, col(Trial.status) == TrialStatus.LEASED.value)
        .order_by(col(Trial.id))
    ).all()
    now = utcnow()
    return [
        RunningTrial(
            trial=t.number,
            trial_id=t.id,  # type: ignore[arg-type]
            version=version,
            runner=t.runner_id,
            attempt=t.attempt,
            started_at=t.started_at,
            elapsed_s=None if t.started_at is None else (now - t.started_at).total_seconds(),
            rss=t.rss,
            steps=t.steps,
            floor_first=t.floor_first,
            floor=t.floor,
            early_stop=early_stop_state(job, trials, t),
        )
        for t, version in rows
    ]


def early_stop_state(job: Job, trials: Sequence[Trial], trial: Trial) -> str:
    """What the early-stop rule can do for running `trial` now, in words: the settings it was
    sent (`specs.early_stop` over the job's runs that had ended when it was leased) and the
    steps of its last heartbeat."""
    leased = trial.started_at
    ended = [t for t in trials if leased and t.finished_at and t.finished_at <= leased]
    return live_state(specs.early_stop(job, ended), trial.steps or 0)


def job_report(session: Session, job: Job, trials: Sequence[Trial] | None = None) -> Report:
    """The job's answer and evidence (as `bisect-cli run --json` prints it); `trials`: the
    job's, when the caller has read them already."""
    candidates = store.candidates_of(session, job)
    linked = links(session, job, candidates)  # other owners' jobs are not named
    if trials is None:
        trials = store.trials_of(session, job)
    return build_report(job, candidates, trials, linked)


def job_public(session: Session, job: Job) -> JobPublic:
    """The report with where the job stands: what `GET /jobs/{id}` answers (polled every
    second by `submit --wait`: the job's trials are read once for both)."""
    assert job.id is not None
    trials = store.trials_of(session, job)
    progress = progress_of(session, [job.id])[job.id]
    progress.running = running_trials(session, job, trials)
    return with_progress(job_report(session, job, trials), progress, job)


def job_markdown(session: Session, job: Job, url: str | None = None) -> str:
    """The report as paste-ready Markdown; `url`: the job's status page, linked when given."""
    return markdown_report(job_report(session, job), url)


def job_summary(job: Job, url: str | None) -> JobSummary:
    """A job as the list shows it (also `bisect-cli list` on the local database)."""
    return JobSummary(
        id=job.id,  # type: ignore[arg-type]
        url=url,
        status=job.status,
        message=job.message,
        package=job.target.package,
        range=job.target.range,
        find_fix=job.find_fix,
        requires_gpu=job.requires_gpu,
        created_at=job.created_at,
        finished_at=job.finished_at,
        result=dump(job.result),
        owner=job.owner,
    )


def trial_public(session: Session, trial: Trial) -> TrialPublic:
    """A trial as clients read it (also `bisect-cli logs` on the local database)."""
    candidate = session.get(Candidate, trial.candidate_id)
    assert candidate is not None and trial.id is not None
    return TrialPublic(**trial.model_dump(exclude={"id"}), id=trial.id, version=candidate.version)


def evidence_curves(session: Session, report: Report) -> dict[int, list[float]]:
    """RSS series of the report's evidence trials (by trial number), for its sparklines."""
    runs = [run for item in report.evidence for run in item.runs]
    samples = store.samples_of(session, [run.trial_id for run in runs])
    return {run.trial: [float(s.rss) for s in samples[run.trial_id]] for run in runs}


def job_webhooks(session: Session, job: Job) -> list[WebhookDeliveryPublic]:
    """The webhooks the job's end sends and their attempts (service/webhooks.py), oldest
    first: `GET /jobs/{id}/webhooks` and the job's page. The operator's URL is never shown."""
    D = WebhookDelivery
    rows = session.exec(select(D).where(D.job_id == job.id).order_by(col(D.id))).all()
    return [
        WebhookDeliveryPublic(
            id=row.id,  # type: ignore[arg-type]
            url=row.url,
            status=row.status,
            next_at=row.next_at,
            attempts=[WebhookAttempt.model_validate(a) for a in row.attempts],
        )
        for row in rows
    ]
