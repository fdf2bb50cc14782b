"""End to end, which allocation site (issue #12): `bisect-cli run` on fixture releases
whose leak is a Python allocation or a native one, with memray installable (PyPI beside
the fixture's wheels): real uv environments, real traced child processes.

(The offline case, where memray cannot install, is pinned in tests/test_run_e2e.py.)
"""

import json
from pathlib import Path

import pytest

from service.example.fixture import FixtureSpec, build_fixture, module_source
from tests.test_run_e2e import EXAMPLE_REPRO, cli, local

pytestmark = pytest.mark.timeout(900)


def line_of(spec: FixtureSpec, text: str) -> int:
    """The 1-based line of `text` in the leaking release's module (no hard-coded guess)."""
    lines = module_source(spec, "1.0.6").splitlines()
    return next(i for i, line in enumerate(lines, 1) if text in line)


@pytest.fixture(scope="module", params=["python", "native"])
def traced(request, reachable_dir, uv_cache: Path):
    spec = FixtureSpec(leak_via=request.param)
    home = reachable_dir(f"attribute-{request.param}")
    wheels = build_fixture(home / "wheels", spec)
    # No --index-url: PyPI, where memray is, plus the fixture's wheels.
    args = [
        "run", str(EXAMPLE_REPRO), "--package", "leakyfixture", "--range", "1.0.5..1.0.6",
        "--find-links", str(wheels), "--database-url", f"sqlite:///{home / 'r.db'}", "--json",
    ]  # fmt: skip
    proc = cli(args, home, uv_cache, timeout=800)
    return spec, proc, home / "r.db"


def test_each_tracer_names_the_leaking_line(traced) -> None:
    spec, proc, _ = traced
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert (report["last_good"], report["first_bad"]) == ("1.0.5", "1.0.6")
    found = report["attribution"]
    tm, mr = found["tracers"]["tracemalloc"], found["tracers"]["memray"]
    assert (tm["available"], mr["available"]) == (True, True)
    touched = f"leakyfixture/__init__.py:{line_of(spec, 'return bytearray')} in _touched"
    if spec.leak_via == "python":
        # Both tracers see the bytearray: the same line, the same package frame.
        assert [s["site"] for s in tm["stacks"]] == [touched]
        assert tm["note"] is None
        assert mr["stacks"][0]["site"] == touched
        assert found["message"].startswith(f"grows at {touched} (+")
        return
    native = f"leakyfixture/__init__.py:{line_of(spec, 'return _lib.leak(n)')} in _native"
    # tracemalloc sees none of it and says so; memray's native stack goes into the C code.
    assert tm["stacks"] == []
    assert tm["note"].startswith("native, not visible to tracemalloc: the stacks explain ")
    top = mr["stacks"][0]
    assert (top["site"], top["in_package"]) == (native, True)
    assert top["frames"][0] == "leak.c:5 in leak"
    assert top["growth_bytes"] >= 39 * 2**20  # 1 MiB per step, 40 steps, never freed
    assert found["message"].startswith(f"grows at {native} (+")


def test_the_text_and_markdown_reports_show_the_sites(traced) -> None:
    _, proc, db = traced
    report = json.loads(proc.stdout)
    site = report["attribution"]["tracers"]["memray"]["stacks"][0]["site"]
    for form in ([], ["--markdown"]):
        shown = local(["report", str(report["job_id"]), *form], db)
        assert shown.returncode == 0, shown.stderr
        assert site in shown.stdout
        assert "tracing perturbs timing: never a verdict" in shown.stdout
