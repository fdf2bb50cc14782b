"""Trials as clients read them: status, timings, log tail, analysis, samples (API tokens).

The runner side of trials (heartbeat, complete, return) is in routes/runners.py.
"""

from fastapi import APIRouter

from runners.wire import Sample
from service import store
from service.api.deps import ClientAuth, SessionDep
from service.api.schemas import TrialPublic, TrialSamples
from service.models import Candidate

router = APIRouter(prefix="/trials", tags=["trials"], dependencies=[ClientAuth])


@router.get("/{trial_id}", response_model=TrialPublic, responses={404: {"description": "none"}})
def get_trial_public(trial_id: int, session: SessionDep) -> TrialPublic:
    """One run of the script: who ran it, when, how it ended, its log tail and analysis."""
    trial = store.trial(session, trial_id)
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
def get_trial_samples(trial_id: int, session: SessionDep) -> TrialSamples:
    """The trial's memory series (bytes; `None` where the source did not say)."""
    store.trial(session, trial_id)
    samples = [
        Sample(t=s.t, rss=s.rss, anon=s.anon, shared=s.shared, gpu=s.gpu, step=s.step)
        for s in store.samples_of(session, [trial_id])[trial_id]
    ]
    return TrialSamples(trial_id=trial_id, samples=samples)
