"""End to end, beyond the release (issue #12): `bisect-cli run` with --from/--to (which
dependency) and --commits (which commit) on generated fixtures; real uv environments, real
child processes, real git. (--attribute: tests/test_attribute_e2e.py.)"""

import json
from pathlib import Path

import pytest

from service.example.fixture import build_fixture
from service.example.gitrepo import build_repo
from service.example.index import serve_index
from service.example.suite import build_suite
from tests.test_run_e2e import EXAMPLE_REPRO, cli

A, B, D = "suite-alpha 0.4.3", "suite-beta 2.0.4", "suite-delta 1.1.1"
G = "suite-gamma 1.0.5"
# The mixes ddmin judged, in the order it asked (engine/ddmin.py), and their verdicts.
EXPECTED = {
    "one": {
        "message": "leaks when suite-gamma 1.0.0 -> 1.0.5 is applied",
        "mixes": [
            ("--from env", "clean"), ("--to env", "leak"), (f"mix: {A}, {B}, {D}", "clean"),
            (f"mix: suite-epsilon 1.0.3, {G}, suite-zeta 3.1.2", "leak"),
            (f"mix: suite-epsilon 1.0.3, {G}", "leak"), ("mix: suite-epsilon 1.0.3", "clean"),
            (f"mix: {G}", "leak"),
        ],
        "releases": [("suite-gamma", "1.0.2", "1.0.3")],
        # Its bounds are mixes already judged: only the bisection, the confirmation and the
        # witness above the first bad (engine/planner.py rule 5) run.
        "visited": ["1.0.2", "1.0.3", "1.0.2", "1.0.3", "1.0.4"],
    },
    "interaction": {
        "message": "leaks only when both suite-beta 2.0.4 and suite-delta 1.1.1 are new",
        "mixes": [
            ("--from env", "clean"), ("--to env", "leak"), (f"mix: {A}, {B}, {D}", "leak"),
            (f"mix: {A}, {B}", "clean"), (f"mix: {D}", "clean"), (f"mix: {A}", "clean"),
            (f"mix: {B}", "clean"), (f"mix: {B}, {D}", "leak"),
        ],
        "releases": [("suite-beta", "2.0.1", "2.0.2"), ("suite-delta", "1.0.2", "1.1.0")],
        "visited": ["2.0.2", "2.0.1", "2.0.1", "2.0.2", "2.0.3"],
    },
    "unresolvable": {
        "message": "leaks when suite-gamma 1.0.0 -> 1.0.5 is applied",
        # epsilon 2.x needs zeta >= 2: a mix with new epsilon and old zeta is skipped.
        "mixes": [
            ("--from env", "clean"), ("--to env", "leak"), (f"mix: {A}, {B}, {D}", "clean"),
            (f"mix: suite-epsilon 2.1.0, {G}, suite-zeta 2.0.1", "leak"),
            (f"mix: suite-epsilon 2.1.0, {G}", "skip"), ("mix: suite-zeta 2.0.1", "clean"),
            ("mix: suite-epsilon 2.1.0", "skip"), (f"mix: {G}", "leak"),
        ],
        "releases": [("suite-gamma", "1.0.2", "1.0.3")],
        "visited": ["1.0.2", "1.0.3", "1.0.2", "1.0.3", "1.0.4"],
    },
}  # fmt: skip


@pytest.fixture(scope="module", params=sorted(EXPECTED))
def dependency(request, reachable_dir, uv_cache: Path):
    home = reachable_dir(f"dependency-{request.param}")
    suite = build_suite(home / "suite", request.param)
    with serve_index(suite.find_links) as index:
        args = [
            "run", str(suite.repro), "--from", str(suite.good), "--to", str(suite.bad),
            "--index-url", index, "--database-url", f"sqlite:///{home / 'r.db'}", "--json",
            "--no-attribute",
        ]  # fmt: skip
        proc = cli(args, home, uv_cache)
    return request.param, suite, proc


def test_which_dependency_then_which_release(dependency) -> None:
    scenario, suite, proc = dependency
    assert proc.returncode == 0, proc.stderr
    report, expected = json.loads(proc.stdout), EXPECTED[scenario]
    found = report["dependency"]
    assert [c["name"] for c in found["culprits"]] == list(suite.culprits)
    assert (found["message"], found["certified"]) == (expected["message"], True)
    assert [(m["label"], m["verdict"]) for m in found["mixes"]] == expected["mixes"]
    assert all(m["trials"] == 1 for m in found["mixes"])
    # Each culprit's first bad release, with the other culprits held at their new versions.
    releases = [(r["package"], r["last_good"], r["first_bad"]) for r in found["releases"]]
    assert releases == expected["releases"]
    assert {name: first_bad for name, _, first_bad in releases} == dict(suite.first_bad)
    first = expected["releases"][0]
    assert (report["status"], report["package"]) == ("found", first[0])
    assert (report["last_good"], report["first_bad"]) == first[1:]
    tried = [c for c in report["candidates"] if c["trials"]]
    assert [c["version"] for c in tried] == sorted(set(expected["visited"]))
    # ddmin stays within the bound the README states for this many changes.
    assert len(found["changes"]) == 6
    assert len(found["mixes"]) <= found["worst_case_mixes"] == 6 * 6 + 3 * 6 + 2


@pytest.fixture(scope="module")
def commits(reachable_dir, uv_cache: Path):
    home = reachable_dir("commits")
    # 12 commits between v1.0.5 and v1.0.6, the leak in the 7th; the 9th does not build,
    # and the bisection lands on it (the middle of the upper half).
    repo = build_repo(home / "repo", commits=12, leaking=7, broken=9)
    wheels = build_fixture(home / "wheels")
    with serve_index(wheels) as index:
        args = [
            "run", str(EXAMPLE_REPRO), "--package", "leakyfixture", "--range", "1.0.5..1.0.7",
            "--index-url", index, "--commits", "--repo", str(repo.path), "--no-attribute",
            "--database-url", f"sqlite:///{home / 'r.db'}", "--json",
        ]  # fmt: skip
        proc = cli(args, home, uv_cache)
    return repo, proc


def test_which_commit(commits) -> None:
    repo, proc = commits
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert (report["last_good"], report["first_bad"]) == ("1.0.5", "1.0.6")
    found = report["commit"]
    shas = [sha for sha, _ in repo.commits]
    assert found["status"] == "found", found  # the record says why, should it not be
    assert found["first_bad"] == {
        "sha": repo.leaking_sha,
        "subject": "cache decoded frames in a module-level list (introduces the leak)",
    }
    assert found["last_good"]["sha"] == shas[5]
    assert found["unbuildable"] == [
        {"sha": repo.broken_sha, "subject": "build: read the version from leakyfixture/VERSION"}
    ]
    assert found["commits"] == 13  # v1.0.5's commit, then the 12 after it
    assert found["message"] == (
        f"first leaking commit: {repo.leaking_sha[:12]} cache decoded frames in a "
        "module-level list (introduces the leak)"
    )
