"""The result of a job as one typed `Report`: what `run --json`, `submit --wait`, `status`,
the API and (soon) the web page and the Markdown report all render.

The boundary pair is kept in the planner's terms (`last_old`, `first_new`) and written out
under the names a reader expects: ``last_good``/``first_bad``, or ``last_bad``/``first_good``
for find-fix jobs, in the report and in each `dependency_diff` row. `Report.model_validate`
reads that wire form back.

A job that ended on a trial's infrastructure failures (service/queue.py) says so first in
its message, and `Report.infrastructure` holds the failure typed (its cause, host and rule,
how often and on how many runners): never "untestable", never a skip.

The environment line ends, once per job, with the isolation any of its runs lacked on
its runner (``trials ran without: ...``, from each trial's `TrialReport.missing_protections`).

Other jobs a candidate points at (the job that contradicted its verdict, the job its
verdict was copied from) are named only when they are the job's owner's own (`Links`,
`links`): inside a trust group (service/reuse.py rules 3 and 6) they may be another
owner's, and an owner sees only their own jobs. `contradiction_note` and `reuse_note`
(service/schemas.py, beside the rows they read) word them once for the text, Markdown and
web views.
"""

import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from sqlmodel import Session, col, select

from contract.envargs import freeze_diff, index_args
from contract.wire import Failure
from engine import crash
from engine.verdicts import Verdict
from service import kinds, queue, stages
from service.models import Candidate, Job, Trial, TrialStatus
from service.schemas import (
    CandidateRow,
    Evidence,
    InfrastructureStop,
    JobPublic,
    Progress,
    Report,
    RunEvidence,
    TransitionRow,
    dependency_change,
    infrastructure_note,
)
from service.specs import env_spec
from service.state import dump
from service.trials import ending_failure


def _runs(trials: list[Trial]) -> list[Trial]:
    """The finished runs of the script (service/kinds.py: no other kind is a run); not one
    the infrastructure failed until the job ended, which ran nothing."""
    return [
        t
        for t in kinds.runs(trials)
        if t.status == TrialStatus.DONE and not queue.infrastructure_spent(t)
    ]


def run_error(trial: Trial) -> str | None:
    """Why a run failed, in one line: the runner's own error, else the script's last words;
    for a skip, the line that says the repro cannot run on the release, else which skip it
    was (service/trials.py `skip_why`: the script's exit 125, uv's no resolution, ...)."""
    if trial.verdict == Verdict.SKIP:
        analysis = trial.analysis or {}
        return analysis.get("cannot_run") or analysis.get("skipped")
    if trial.verdict != Verdict.ERROR:
        return None
    return trial.error.strip().splitlines()[0] if trial.error else crash.error_line(trial.log_tail)


def _last_error(candidate: Candidate, done: list[Trial]) -> str | None:
    errors = [run_error(t) for t in done if t.candidate_id == candidate.id]
    found = [e for e in errors if e]
    return found[-1] if found and candidate.verdict in (Verdict.ERROR, Verdict.SKIP) else None


@dataclass(frozen=True)
class Links:
    """The other jobs a job's candidates point at, as the job's viewers may see them."""

    # A reused candidate's `reused_from` (a candidate id) -> that candidate's job.
    sources: Mapping[int, int] = field(default_factory=dict)
    # The jobs among those and the `contradicted_by_job`s that another owner owns.
    hidden: frozenset[int] = frozenset()

    def shown(self, job_id: int | None) -> int | None:
        """`job_id` when this job's owner may see it, else None."""
        return None if job_id is None or job_id in self.hidden else job_id


# What `build_report` assumes without a session (`bisect-cli run`: one owner's database).
NO_LINKS = Links()


def links(session: Session, job: Job, candidates: list[Candidate]) -> Links:
    """Which jobs `job`'s candidates point at, and which of them another owner owns (owner
    None is its own owner: `bisect-cli run` or an open service). A job no longer stored is
    not hidden: its id names nobody's work."""
    ids = sorted({c.reused_from for c in candidates if c.reused_from is not None})
    sources: dict[int, int] = {}
    if ids:
        query = select(Candidate.id, Candidate.job_id).where(col(Candidate.id).in_(ids))
        sources = {cid: jid for cid, jid in session.exec(query) if cid is not None}
    jobs = {c.contradicted_by_job for c in candidates if c.contradicted_by_job is not None}
    jobs |= set(sources.values())
    jobs.discard(job.id)  # type: ignore[arg-type]
    hidden: frozenset[int] = frozenset()
    if jobs:
        query_owners = select(Job.id, Job.owner).where(col(Job.id).in_(sorted(jobs)))
        hidden = frozenset(
            jid
            for jid, owner in session.exec(query_owners)
            if jid is not None and owner != job.owner
        )
    return Links(sources=sources, hidden=hidden)


def candidate_rows(
    candidates: list[Candidate],
    trials: list[Trial],
    job: Job | None = None,
    linked: Links = NO_LINKS,
) -> list[CandidateRow]:
    done = _runs(trials)
    tested = {t.candidate_id for t in done}
    spent = ending_failure(trials)
    failed = {} if spent is None else {spent.candidate_id: _spent_note(spent)}
    return [
        CandidateRow(
            position=c.position,
            version=c.version,
            verdict=c.verdict,
            yanked=c.yanked,
            yanked_reason=c.yanked_reason,
            testable=c.testable,
            untestable_reason=c.untestable_reason,
            trials=sum(1 for t in done if t.candidate_id == c.id),
            growth_mib=None if c.growth_mib is None else round(c.growth_mib, 2),
            upload_time=c.upload_time.isoformat() if c.upload_time else None,
            resolution=c.resolution,
            resolution_note=c.resolution_note,
            reused=c.reused_from is not None,
            reused_from_job=linked.shown(linked.sources.get(c.reused_from or -1)),
            contradicted=c.contradicted_by_job is not None,
            contradicted_by_job=linked.shown(c.contradicted_by_job),
            error=_last_error(c, done),
            reproduce=reproduce_command(job, c) if job is not None and c.id in tested else None,
            pooled=(c.pooled or {}).get("reason"),
            infrastructure=failed.get(c.id),  # type: ignore[arg-type]
        )
        for c in candidates
    ]


def _spent_note(trial: Trial) -> str:
    failures = trial.infra_failures
    return infrastructure_note(len(failures), len({f.get("runner") for f in failures}))


def evidence(candidate: Candidate, trials: list[Trial]) -> Evidence:
    runs = [t for t in _runs(trials) if t.candidate_id == candidate.id]
    return Evidence(
        version=candidate.version,
        verdict=candidate.verdict,
        runs=[
            RunEvidence(
                trial=t.number,
                trial_id=t.id,  # type: ignore[arg-type]
                verdict=t.verdict,
                exit_code=t.exit_code,
                oom_killed=t.oom_killed,
                duration_s=t.duration_s,
                analysis=t.analysis,
                error=run_error(t),
                stopped_early=(t.analysis or {}).get("stopped_early"),
            )
            for t in runs
        ],
        pooled=candidate.pooled,
    )


def reproduce_command(job: Job, candidate: Candidate) -> str:
    """A shell line that rebuilds one candidate exactly as tested and runs the repro by hand."""
    venv = ["uv", "venv", "/tmp/leakbisect-repro"] + (
        ["--python", job.python] if job.python else []
    )
    # The recorded freeze pins every package as it was during the trial.
    packages = candidate.freeze or [f"{job.target.package}=={candidate.version}", *job.requirements]
    install = ["uv", "pip", "install", "--python", "/tmp/leakbisect-repro", *packages]
    install += index_args(env_spec(job, candidate))
    run = ["/tmp/leakbisect-repro/bin/python", job.script_name]
    return " && ".join(shlex.join(part) for part in (venv, install, run))


def _unjudged(candidate: Candidate) -> bool:
    return not candidate.testable or (
        candidate.verdict is not None and not Verdict(candidate.verdict).decisive
    )


def dependency_section(job: Job, trials: list[Trial]) -> dict[str, Any] | None:
    """--from/--to's answer for reports: what changed, the minimal set, each mix's runs."""
    if job.dependency is None:
        return None
    found = {k: v for k, v in job.dependency.dump().items() if k not in ("good", "bad")}
    runs = _runs(trials)
    found["mixes"] = [
        {**mix, "trials": sum(1 for t in runs if t.candidate_id == mix.get("candidate_id"))}
        for mix in found.get("mixes", [])
    ]
    # Each culprit's own release search (the first one's is also the report's pair).
    found["releases"] = [
        {"package": r.package or job.target.package, "status": r.status,
         "last_good": r.result.last_old if r.result else None,
         "first_bad": r.result.first_new if r.result else None, "message": r.message}
        for r in job.stages
        if r.stage == stages.RELEASES or r.stage.startswith(stages.CULPRIT_PREFIX)
    ]  # fmt: skip
    return found


def environment(job: Job) -> str:
    """How the packages besides the bisected one were chosen (the report's line): the
    environment policy says (service/envpolicy.py)."""
    return job.env_policy.describe(
        package=job.target.package,
        as_of=job.pins_as_of,
        newest=job.target.bad,
        find_fix=job.find_fix,
    )


def missing_protections(trials: list[Trial]) -> list[str]:
    """The isolation any run of the job lacked (`TrialReport.missing_protections`, kept in
    the trial's analysis), each once, in the order first seen."""
    found = (p for t in _runs(trials) for p in (t.analysis or {}).get("missing_protections") or [])
    return list(dict.fromkeys(found))


def environment_line(job: Job, trials: list[Trial]) -> str:
    """`environment`, then, once per job, what isolation the trials ran without."""
    line = environment(job)
    missing = missing_protections(trials)
    if missing:
        line += f"; trials ran without: {', '.join(missing)}"
    return line


def infrastructure_stop(
    candidates: list[Candidate], trials: list[Trial]
) -> InfrastructureStop | None:
    """The trial whose infrastructure failures ended the job (service/queue.py), as the
    report's `infrastructure`; None when none did."""
    spent = ending_failure(trials)
    version = next((c.version for c in candidates if spent and c.id == spent.candidate_id), None)
    if spent is None or version is None:
        return None
    failures = spent.infra_failures
    last = Failure.model_validate(failures[-1])
    return InfrastructureStop(
        version=version,
        trial=spent.number,
        tries=len(failures),
        runners=len({f.get("runner") for f in failures}),
        **last.model_dump(),
    )


def build_report(
    job: Job, candidates: list[Candidate], trials: list[Trial], linked: Links = NO_LINKS
) -> Report:
    """The job's report; `linked` (`links`): which other jobs its viewers may see named."""
    result = job.result
    by_version = {c.version: c for c in candidates}
    last_old = by_version.get(result.last_old or "") if result else None
    first_new = by_version.get(result.first_new or "") if result else None
    report = Report(
        job_id=job.id,
        status=job.status,
        message=job.message,
        package=job.target.package,
        range=job.target.range,
        find_fix=job.find_fix,
        last_old=last_old.version if last_old else None,
        first_new=first_new.version if first_new else None,
        between=list(result.skipped) if result else [],
        skipped=[c.version for c in candidates if _unjudged(c)],
        not_monotone=result.not_monotone if result else None,
        disagree=list(result.disagree) if result else [],
        transitions=[TransitionRow(**t.dump()) for t in result.transitions] if result else [],
        candidates=candidate_rows(candidates, trials, job, linked),
        trials=len(_runs(trials)),
        machine=job.machine,
        environment=environment_line(job, trials),
        dependency=dependency_section(job, trials),
        attribution=dump(job.attribution),
        commit=dump(job.commit),
        infrastructure=infrastructure_stop(candidates, trials),
    )
    if last_old and first_new:
        report.dependency_diff = [
            dependency_change(job.find_fix, name, a, b)
            for name, a, b in freeze_diff(last_old.freeze, first_new.freeze)
        ]
        report.evidence = [evidence(last_old, trials), evidence(first_new, trials)]
        leaking = first_new if not job.find_fix else last_old
        report.reproduce = reproduce_command(job, leaking)
    elif job.status not in ("queued", "running") and candidates:
        # No pair to show: the bounds are the evidence (why they failed, what they ran).
        bounds = [candidates[0], candidates[-1]]
        report.evidence = [evidence(c, trials) for c in bounds if c.verdict is not None]
        report.message = _with_crash_hints(report.message, job, bounds, trials)
    return report


def _with_crash_hints(
    message: str | None, job: Job, bounds: list[Candidate], trials: list[Trial]
) -> str | None:
    """The message, plus the line each errored bound ended on and the fix that fits (a bound
    the repro cannot run on: the fix alone, the planner's message has the line)."""
    names = ("old bound", "new bound") if job.find_fix else ("good bound", "bad bound")
    lines = [message] if message else []
    done = _runs(trials)
    for name, bound in zip(names, bounds, strict=True):
        failed = [t for t in done if t.candidate_id == bound.id and run_error(t)]
        if bound.verdict not in (Verdict.ERROR, Verdict.SKIP) or not failed:
            continue
        last = failed[-1]
        line = run_error(last)
        if bound.verdict == Verdict.ERROR:
            lines.append(f"{name} {bound.version} ended: {line}")
        fix = crash.hint(
            line,
            last.log_tail or "",
            bisected=job.target.package,
            freeze=bound.freeze,
            shared_pins=job.env_policy.shared_pins,
        )
        if fix:
            lines.append(f"hint: {fix}")
    return "\n".join(lines) or None


def with_progress(report: Report, progress: Progress, job: Job) -> JobPublic:
    return JobPublic(
        **report.model_dump(),
        progress=progress,
        created_at=job.created_at,
        finished_at=job.finished_at,
    )
