"""The result of a job as one JSON-ready dict: `run`, `submit --wait`, `status`, the API."""

import shlex
from typing import Any

from runners.envs import freeze_diff, index_args
from service.models import Candidate, Job, Trial, TrialStatus
from service.trials import env_spec
from service.verdicts import Verdict

EXIT_CODES = {"found": 0, "bounds_failed": 3, "inconclusive": 4, "error": 1, "cancelled": 1}
UNJUDGED = {Verdict.SKIP, Verdict.ERROR, Verdict.INCONCLUSIVE}


def boundary_names(find_fix: bool) -> tuple[str, str]:
    """JSON keys for the planner's (last_old, first_new) pair."""
    return ("last_bad", "first_good") if find_fix else ("last_good", "first_bad")


def candidate_rows(candidates: list[Candidate], trials: list[Trial]) -> list[dict[str, Any]]:
    done = [t for t in trials if t.status == TrialStatus.DONE]
    return [
        {
            "position": c.position,
            "version": c.version,
            "verdict": c.verdict,
            "yanked": c.yanked,
            "yanked_reason": c.yanked_reason,
            "testable": c.testable,
            "untestable_reason": c.untestable_reason,
            "trials": sum(1 for t in done if t.candidate_id == c.id),
            "growth_mib": None if c.growth_mib is None else round(c.growth_mib, 2),
            "upload_time": c.upload_time.isoformat() if c.upload_time else None,
            "resolution": c.resolution,
            "reused": c.reused_from is not None,
        }
        for c in candidates
    ]


def evidence(candidate: Candidate, trials: list[Trial]) -> dict[str, Any]:
    runs = [t for t in trials if t.candidate_id == candidate.id and t.status == TrialStatus.DONE]
    return {
        "version": candidate.version,
        "verdict": candidate.verdict,
        "runs": [
            {
                "trial": t.id,
                "verdict": t.verdict,
                "exit_code": t.exit_code,
                "oom_killed": t.oom_killed,
                "duration_s": t.duration_s,
                "analysis": t.analysis,
            }
            for t in runs
        ],
    }


def reproduce_command(job: Job, candidate: Candidate) -> str:
    """A shell line that rebuilds one candidate exactly as tested and runs the repro by hand."""
    venv = ["uv", "venv", "/tmp/leakbisect-repro"] + (
        ["--python", job.python] if job.python else []
    )
    # The recorded freeze pins every package as it was during the trial.
    packages = candidate.freeze or [f"{job.package}=={candidate.version}", *job.requirements]
    install = ["uv", "pip", "install", "--python", "/tmp/leakbisect-repro", *packages]
    install += index_args(env_spec(job, candidate))
    run = ["/tmp/leakbisect-repro/bin/python", job.script_name]
    return " && ".join(shlex.join(part) for part in (venv, install, run))


def build_report(job: Job, candidates: list[Candidate], trials: list[Trial]) -> dict[str, Any]:
    old_key, new_key = boundary_names(job.find_fix)
    result = job.result or {}
    by_version = {c.version: c for c in candidates}
    last_old = by_version.get(result.get("last_old") or "")
    first_new = by_version.get(result.get("first_new") or "")
    report: dict[str, Any] = {
        "job_id": job.id,
        "status": job.status,
        "message": job.message,
        "package": job.package,
        "range": f"{job.good}..{job.bad}",
        "find_fix": job.find_fix,
        old_key: last_old.version if last_old else None,
        new_key: first_new.version if first_new else None,
        "between": list(result.get("skipped", [])),
        "skipped": [
            c.version
            for c in candidates
            if not c.testable or (c.verdict is not None and Verdict(c.verdict) in UNJUDGED)
        ],
        "candidates": candidate_rows(candidates, trials),
        "trials": sum(1 for t in trials if t.status == TrialStatus.DONE),
        "dependency_diff": [],
        "evidence": [],
        "reproduce": None,
        "machine": job.machine,
    }
    if last_old and first_new:
        report["dependency_diff"] = [
            {"package": name, old_key: a, new_key: b}
            for name, a, b in freeze_diff(last_old.freeze, first_new.freeze)
        ]
        report["evidence"] = [evidence(last_old, trials), evidence(first_new, trials)]
        leaking = first_new if not job.find_fix else last_old
        report["reproduce"] = reproduce_command(job, leaking)
    return report


def exit_code(status: str) -> int:
    return EXIT_CODES.get(status, 1)
