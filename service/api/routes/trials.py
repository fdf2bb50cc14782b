"""Trials as clients read them: status, timings, log tail, analysis, samples (API tokens).

The runner side of trials (heartbeat, complete, return) is in routes/runners.py.
"""

from fastapi import APIRouter
from sqlmodel import Session

from runners.wire import Sample
from service import store
from service.api.deps import Caller, ReaderDep, SessionDep
from service.api.schemas import TrialPublic, TrialSamples
from service.models import Candidate, Job, Trial

router = APIRouter(prefix="/trials", tags=["trials"])


def readable_trial(session: Session, trial_id: int, caller: Caller) -> Trial:
    """The trial, if this caller may see its job (404 otherwise)."""
    trial = store.trial(session, trial_id)
    job = session.get(Job, trial.job_id)
    if job is None or not caller.may_read(job.owner):
        raise store.TrialNotFound(f"trial {trial_id} not found")
    return trial


@router.get("/{trial_id}", response_model=TrialPublic, responses={404: {"description": "none"}})
def get_trial_public(trial_id: int, session: SessionDep, caller: ReaderDep) -> TrialPublic:
    """One run of the script: who ran it, when, how it ended, its log tail and analysis."""
    trial = readable_trial(session, trial_id, caller)
    candidate = session.get(Candidate, trial.candidate_id)
    assert candidate is not None
    return TrialPublic(
        **trial.model_dump(exclude={"id"}),
        id=trial_id,
        version=candidate.version,
    )


@router.get(
    "/{trial_id}/samples", response_model=TrialSamples, responses={404: {"description": "none"}}
)
def get_trial_samples(trial_id: int, session: SessionDep, caller: ReaderDep) -> TrialSamples:
    """The trial's memory series (bytes; `None` where the source did not say)."""
    readable_trial(session, trial_id, caller)
    samples = [
        Sample(t=s.t, rss=s.rss, anon=s.anon, shared=s.shared, gpu=s.gpu, step=s.step)
        for s in store.samples_of(session, [trial_id])[trial_id]
    ]
    return TrialSamples(trial_id=trial_id, samples=samples)
