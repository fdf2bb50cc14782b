"""The stages beyond the releases, as lines of plain text: one wording for every report.

The text report (service/cli/display.py), the Markdown report (service/markdown.py) and
the web page's evidence section (service/web/templates/_job_live.html) all show
`Report.dependency`, `Report.attribution` and `Report.commit` through these functions,
so the three say the same thing. Pure: dicts in, strings out (the caller escapes).
"""

from typing import Any, Protocol

MIB = 1024 * 1024


class Found(Protocol):
    """What a report or a job's wire model holds of the stages beyond the releases."""

    dependency: dict[str, Any] | None
    attribution: dict[str, Any] | None
    commit: dict[str, Any] | None


def sections(found: Found, *, frames: int) -> list[tuple[str, str, list[str]]]:
    """The questions answered, in report order: (key, title, lines); `frames` as
    `attribution_lines` takes it."""
    every = [
        ("dependency", "Which dependency", dependency_lines(found.dependency)),
        ("attribution", "Which allocation site",
         attribution_lines(found.attribution, frames=frames)),
        ("commit", "Which commit", commit_lines(found.commit)),
    ]  # fmt: skip
    return [section for section in every if section[2]]


def _count(n: int, noun: str, plural: str | None = None) -> str:
    return f"{n} {noun if n == 1 else plural or noun + 's'}"


def dependency_lines(dependency: dict[str, Any] | None) -> list[str]:
    """Which dependency: the changes, the minimal set and every mix that was judged."""
    if not dependency:
        return []
    changes = dependency.get("changes", [])
    mixes = dependency.get("mixes", [])
    lines = [
        f"{_count(len(changes), 'package')} changed between --from and --to; "
        f"{_count(len(mixes), 'mix', 'mixes')} judged (at most "
        f"{dependency.get('worst_case_mixes')} for {_count(len(changes), 'change')})"
    ]
    if dependency.get("message"):
        lines.append(str(dependency["message"]))
    if dependency.get("culprits") is not None:
        certified = dependency.get("certified")
        lines.append(
            "certified 1-minimal: removing any one culprit makes it clean"
            if certified
            else "not certified 1-minimal: "
            + ", ".join(", ".join(u) or "--from" for u in dependency.get("untested", []))
            + " could not be judged"
        )
    for found in dependency.get("releases", []):
        if found.get("first_bad"):
            lines.append(
                f"{found['package']}: first bad release {found['first_bad']}, "
                f"last good {found['last_good']} (the other culprits held new)"
            )
        else:
            lines.append(f"{found['package']}: {found.get('message')}")
    for mix in mixes:
        trials = _count(mix.get("trials", 0), "trial")
        lines.append(f"  {mix.get('label')}: {mix.get('verdict')} ({trials})")
    return lines


def _stack_lines(stack: dict[str, Any], package: str | None, frames: int) -> list[str]:
    """The site, then where below it the memory was allocated (a native stack's C frame
    under the package's Python line), then `frames` of its callers."""
    mark = f" <- {package}" if stack.get("in_package") and package else ""
    lines = [f"  {stack.get('growth_bytes', 0) / MIB:+.1f} MiB  {stack.get('site')}{mark}"]
    chain = list(stack.get("frames", []))
    at = chain.index(stack["site"]) if stack.get("site") in chain else 0
    if at > 0:
        lines.append(f"      allocated in {chain[0]}")
    return lines + [f"      {frame}" for frame in chain[at + 1 : at + 1 + frames]]


def attribution_lines(attribution: dict[str, Any] | None, *, frames: int = 0) -> list[str]:
    """Which allocation site, per tracer; `frames`: how many outer frames to add per stack."""
    if not attribution:
        return []
    reused = attribution.get("reused_from")
    lines = [
        f"stacks growing in {attribution.get('first_bad')} and not in "
        f"{attribution.get('last_good')} (tracing perturbs timing: never a verdict)"
        + (f"; reused from job {reused}" if reused else "")
    ]
    for tracer, found in (attribution.get("tracers") or {}).items():
        seconds = found.get("seconds") or {}
        took = ", ".join(f"{k} {v:.1f} s" for k, v in seconds.items() if v is not None)
        head = f"{tracer}{f' ({took})' if took else ''}"
        # What it found, then how its runs ended (engine/attribution.py rule 9).
        said = [str(found[k]) for k in ("note", "cut_short", "stopped") if found.get(k)]
        lines.append(f"{head}: {'; '.join(said)}" if said else head)
        for stack in found.get("stacks", []):
            lines += _stack_lines(stack, attribution.get("package"), frames)
    return lines


def commit_lines(commit: dict[str, Any] | None) -> list[str]:
    """Which commit: the first bad one, the last good one, and those that did not build."""
    if not commit:
        return []
    if not commit.get("message"):  # a runner is listing them
        return [
            f"listing the commits from {commit.get('last_good_release')} to "
            f"{commit.get('first_bad_release')} in {commit.get('repo')}"
        ]
    lines = [str(commit["message"])]
    if commit.get("repo"):
        lines.append(f"  repository: {commit['repo']}")
    if "commits" not in commit:  # they could not be listed: the message says why
        return lines
    for name in ("last_good", "first_bad"):
        entry = commit.get(name)
        if entry:
            lines.append(f"  {name.replace('_', ' ')}: {entry['sha']} {entry.get('subject') or ''}")
    for entry in commit.get("unbuildable", []):
        lines.append(f"  did not build (skipped): {entry['sha'][:12]} {entry.get('subject') or ''}")
    lines.append(f"  {commit.get('commits')} commits between the two tags, both tags included")
    return lines
