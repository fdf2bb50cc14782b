"""One handler per trial kind: what the service does for each `TrialKind`, registered once.

The kind itself is defined once, in `contract.wire.TrialKind`; the runners' side of each
kind is `runners.kinds`. Here is the service's side, as what each kind *is*, so that every
concern asks its trial's handler once (`handler(trial.kind)`) instead of comparing kinds:

* ``run``: a run of the search (`Kind.judged`). The classifier judges its report
  (service/trials.py), its verdict settles its candidate's evaluation (service/scheduler.py),
  its duration and steps are the job's horizon and its spec carries early stop
  (service/specs.py); verdict reuse, progress and the report count only these
  (`judged`, `JUDGED`).
* ``attribute``: runs the script under the allocation tracer (`Kind.traced`): its spec
  carries `trace_stop`, its report keeps the profile and its memory, and its verdict never
  decides (tracing perturbs timing).
* ``resolve``: runs no script; resolves the requirements as of the job's pin cutoff
  (`Kind.resolves`), and its report settles the job's pins (service/pins.py).
* ``commits``: runs no script; lists the commits of the job's commit range
  (`Kind.lists_commits`: its spec carries the range, its report the commits).

`Kind.started` is the line a local run prints when the trial starts (None: a run, which the
display shows as a trial of its own). The stage that queues a kind's trials names that kind
(service/pins.py the resolve trial, service/pipeline.py the commits and attribute trials).
A `TrialKind` without a handler fails at import.
"""

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from sqlmodel import col

from contract.wire import TrialKind
from service.models import Candidate, Job, Trial

Label = Callable[[Job, Candidate, Trial], str | None]


def _no_label(_job: Job, _candidate: Candidate, _trial: Trial) -> str | None:
    return None


@dataclass(frozen=True)
class Kind:
    """The service's side of one trial kind (see the module docstring)."""

    kind: TrialKind
    started: Label = _no_label
    judged: bool = False
    traced: bool = False
    resolves: bool = False
    lists_commits: bool = False

    @property
    def runs_script(self) -> bool:
        """Whether the runner runs the job's script for it (its report has samples)."""
        return self.judged or self.traced


def _tracing(job: Job, candidate: Candidate, trial: Trial) -> str:
    return f"tracing {job.target.package} {candidate.version} with {trial.trace}"


def _listing(job: Job, candidate: Candidate, _trial: Trial) -> str:
    return f"listing the commits of {job.target.package} up to {candidate.version}"


def _resolving(job: Job, candidate: Candidate, _trial: Trial) -> str:
    return f"resolving the pins of {job.package}=={candidate.version}"


HANDLERS: dict[TrialKind, Kind] = {
    k.kind: k
    for k in (
        Kind(TrialKind.RUN, judged=True),
        Kind(TrialKind.ATTRIBUTE, _tracing, traced=True),
        Kind(TrialKind.RESOLVE, _resolving, resolves=True),
        Kind(TrialKind.COMMITS, _listing, lists_commits=True),
    )
}
if set(HANDLERS) != set(TrialKind):  # a new kind gets its handler here, or nothing starts
    raise ImportError(f"service.kinds: no handler for {set(TrialKind) - set(HANDLERS)}")

# The kinds whose trials are the search's runs, as stored (`Trial.kind` is a string).
_JUDGED_KINDS = [k.value for k, h in HANDLERS.items() if h.judged]
# A judged run, in a query's WHERE (`Trial.kind` is one of the judged kinds).
JUDGED: Any = col(Trial.kind).in_(_JUDGED_KINDS)


def handler(kind: TrialKind | str) -> Kind:
    """The handler of `kind` (`ValueError` for a name that is no `TrialKind`)."""
    return HANDLERS[TrialKind(kind)]


def judged(trial: Trial) -> bool:
    """Whether `trial` is a run of the search (judged; its verdict counts)."""
    return handler(trial.kind).judged


def runs(trials: Iterable[Trial]) -> list[Trial]:
    """The judged runs among `trials`, in their order."""
    return [t for t in trials if judged(t)]


def of(kind: TrialKind, trials: Iterable[Trial]) -> list[Trial]:
    """The trials of `kind` among `trials`, in their order (a stage reading back the
    trials it queued)."""
    return [t for t in trials if t.kind == kind]


def traced(trials: Iterable[Trial]) -> list[Trial]:
    """The trials among `trials` that ran the script under the tracer, in their order."""
    return [t for t in trials if handler(t.kind).traced]
