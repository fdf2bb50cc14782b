"""Trials as clients read them: status, timings, log tail, analysis, samples (API tokens).

The runner side of trials (heartbeat, complete, return) is in routes/runners.py; what a
trial reads as, and who may read it, is service/views.py's.
"""

from typing import Annotated

from fastapi import APIRouter, Query

from contract.series import downsample
from contract.wire import MAX_REPORT_SAMPLES, Sample
from service import store, views
from service.http.deps import Offset, ReaderDep, SessionDep
from service.schemas import TrialPublic, TrialSamples

router = APIRouter(prefix="/trials", tags=["trials"])


@router.get("/{trial_id}", response_model=TrialPublic, responses={404: {"description": "none"}})
def get_trial_public(trial_id: int, session: SessionDep, caller: ReaderDep) -> TrialPublic:
    """One run of the script: who ran it, when, how it ended, its log tail and analysis."""
    return views.trial_public(session, views.readable_trial(session, trial_id, caller))


@router.get(
    "/{trial_id}/samples", response_model=TrialSamples, responses={404: {"description": "none"}}
)
def get_trial_samples(
    trial_id: int,
    session: SessionDep,
    caller: ReaderDep,
    offset: Offset = 0,
    limit: Annotated[int, Query(ge=1, le=MAX_REPORT_SAMPLES)] = MAX_REPORT_SAMPLES,
    max_points: Annotated[
        int | None,
        Query(ge=4, le=MAX_REPORT_SAMPLES, description="downsample: min/max per time bucket"),
    ] = None,
) -> TrialSamples:
    """The trial's memory series (bytes; `None` where the source did not say), in time order:
    `limit` samples from `offset` (a report holds at most MAX_REPORT_SAMPLES, so the default
    page is all of them), downsampled to `max_points` when given (contract/series.py: the
    minimum and maximum of each time bucket, so floors and spikes survive). `total` counts
    all of the trial's samples."""
    views.readable_trial(session, trial_id, caller)
    rows, total = store.samples_page(session, trial_id, offset=offset, limit=limit)
    samples = [
        Sample(t=s.t, rss=s.rss, anon=s.anon, shared=s.shared, gpu=s.gpu, step=s.step)
        for s in rows
    ]
    if max_points is not None:
        samples = downsample(samples, max_points)
    return TrialSamples(
        trial_id=trial_id,
        samples=samples,
        total=total,
        offset=offset,
        limit=limit,
        max_points=max_points,
    )
