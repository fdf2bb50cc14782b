"""The plain-text lines of the stages beyond the releases (engine/findings.py), exactly:
the text report, the Markdown report and the web page all print these."""

from types import SimpleNamespace
from typing import Any

from engine.findings import attribution_lines, commit_lines, dependency_lines, sections

MIB = 1024 * 1024


def mix(label: str, verdict: str, trials: int = 1) -> dict[str, Any]:
    return {"label": label, "verdict": verdict, "trials": trials}


def test_dependency_lines_count_and_certify() -> None:
    dependency = {
        "changes": [{"name": "suite-gamma"}, {"name": "suite-zeta"}],
        "mixes": [mix("--from env", "clean"), mix("--to env", "leak", 2)],
        "worst_case_mixes": 12,
        "message": "leaks when suite-gamma 1.0.0 -> 1.0.5 is applied",
        "culprits": [{"name": "suite-gamma"}],
        "certified": True,
        "releases": [{"package": "suite-gamma", "last_good": "1.0.2", "first_bad": "1.0.3"}],
    }
    assert dependency_lines(dependency) == [
        "2 packages changed between --from and --to; 2 mixes judged (at most 12 for 2 changes)",
        "leaks when suite-gamma 1.0.0 -> 1.0.5 is applied",
        "certified 1-minimal: removing any one culprit makes it clean",
        "suite-gamma: first bad release 1.0.3, last good 1.0.2 (the other culprits held new)",
        "  --from env: clean (1 trial)",
        "  --to env: leak (2 trials)",
    ]
    one = {**dependency, "changes": [{"name": "suite-gamma"}], "mixes": [mix("--to env", "leak")]}
    one |= {"certified": False, "untested": [["suite-gamma"], []], "releases": []}
    assert dependency_lines(one)[0] == (
        "1 package changed between --from and --to; 1 mix judged (at most 12 for 1 change)"
    )
    assert dependency_lines(one)[2] == (
        "not certified 1-minimal: suite-gamma, --from could not be judged"
    )
    assert dependency_lines(None) == []


def test_attribution_lines_mark_the_package_and_name_each_tracer() -> None:
    stack = {
        "site": "leakyfixture/core.py:41 in step",
        "in_package": True,
        "growth_bytes": 8 * MIB,
        "frames": ["leakyfixture/core.py:41 in step", "repro.py:7 in <module>"],
    }
    attribution = {
        "package": "leakyfixture",
        "last_good": "1.0.5",
        "first_bad": "1.0.6",
        "tracers": {
            "tracemalloc": {"note": None, "stacks": [stack], "seconds": {"good": 2.5, "bad": 2.75}},
            "memray": {"note": "memray did not install: no wheel", "stacks": [], "seconds": {}},
        },
        "reused_from": 4,
    }
    assert attribution_lines(attribution, frames=1) == [
        "stacks growing in 1.0.6 and not in 1.0.5 (tracing perturbs timing: never a verdict)"
        "; reused from job 4",
        "tracemalloc (good 2.5 s, bad 2.8 s)",
        "  +8.0 MiB  leakyfixture/core.py:41 in step <- leakyfixture",
        "      repro.py:7 in <module>",
        "memray: memray did not install: no wheel",
    ]


def test_a_native_stack_shows_its_c_frame_under_the_package_line() -> None:
    frames = [
        "leak.c:5 in leak",
        "<unknown> in ffi_call",
        "leakyfixture/__init__.py:57 in _native",
        "leakyfixture/__init__.py:30 in step",
        "repro.py:24 in main",
    ]
    stack = {"site": frames[2], "in_package": True, "growth_bytes": 40 * MIB, "frames": frames}
    memray = {"note": None, "stacks": [stack], "seconds": {"good": 2.5, "bad": 2.8}}
    attribution = {"package": "leakyfixture", "last_good": "1.0.5", "first_bad": "1.0.6",
                   "tracers": {"memray": memray}}  # fmt: skip
    assert attribution_lines(attribution, frames=2)[1:] == [
        "memray (good 2.5 s, bad 2.8 s)",
        "  +40.0 MiB  leakyfixture/__init__.py:57 in _native <- leakyfixture",
        "      allocated in leak.c:5 in leak",
        "      leakyfixture/__init__.py:30 in step",
        "      repro.py:24 in main",
    ]


def test_commit_lines_name_the_commit_and_the_unbuildable() -> None:
    commit = {
        "message": "first leaking commit: adedb82cd3a3 cache decoded frames",
        "last_good": {"sha": "a" * 40, "subject": "tidy"},
        "first_bad": {"sha": "adedb82cd3a3" + "0" * 28, "subject": "cache decoded frames"},
        "unbuildable": [{"sha": "b" * 40, "subject": "build: read the version from a file"}],
        "commits": 13,
        "repo": "https://example.invalid/leakyfixture.git",
    }
    assert commit_lines(commit) == [
        "first leaking commit: adedb82cd3a3 cache decoded frames",
        "  repository: https://example.invalid/leakyfixture.git",
        f"  last good: {'a' * 40} tidy",
        f"  first bad: adedb82cd3a3{'0' * 28} cache decoded frames",
        f"  did not build (skipped): {'b' * 12} build: read the version from a file",
        "  13 commits between the two tags, both tags included",
    ]


def test_commit_lines_while_listing_and_when_listing_failed() -> None:
    listing = {"repo": "https://example.invalid/r.git", "last_good_release": "1.0.5",
               "first_bad_release": "1.0.6"}  # fmt: skip
    assert commit_lines(listing) == [
        "listing the commits from 1.0.5 to 1.0.6 in https://example.invalid/r.git"
    ]
    failed = {**listing, "status": "error", "message": "--commits: no tag for x 1.0.6"}
    assert commit_lines(failed) == [
        "--commits: no tag for x 1.0.6",
        "  repository: https://example.invalid/r.git",
    ]


def test_sections_keep_the_answered_questions_in_report_order() -> None:
    commit = {"repo": "https://example.invalid/r.git", "last_good_release": "1.0.5",
              "first_bad_release": "1.0.6"}  # fmt: skip
    attribution = {"first_bad": "1.0.6", "last_good": "1.0.5", "tracers": {}}
    found = SimpleNamespace(dependency=None, attribution=attribution, commit=commit)
    assert sections(found, frames=0) == [
        ("attribution", "Which allocation site", attribution_lines(attribution)),
        ("commit", "Which commit", commit_lines(commit)),
    ]
    assert sections(SimpleNamespace(dependency=None, attribution=None, commit=None), frames=2) == []
