"""The resolution policy: as of when a job's other packages are resolved (issue 11).

Unit tests of engine/resolution.py, then the real thing: `bisect-cli run` on the fixture
with a co-dependency that has a release from before the range and one from after it.
"""

import json
import os
import sqlite3
import subprocess
import sys
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from contract.errors import InvalidInput
from engine.resolution import describe, parse_resolve_at, pins_as_of
from service.example.fixture import build_fixture, iso_z, pack_wheel
from service.example.index import serve_index

GOOD = ("1.0.0", datetime(2024, 1, 1, tzinfo=UTC))
NEWEST = ("1.0.9", datetime(2024, 1, 10, 8, 30, tzinfo=UTC))


def test_default_is_the_newest_releases_upload_time() -> None:
    when = pins_as_of(as_released=False, resolve_at=None, good=GOOD, newest=NEWEST)
    assert when == NEWEST[1]


def test_default_without_an_upload_time_is_todays_index() -> None:
    assert pins_as_of(as_released=False, resolve_at=None, good=GOOD, newest=("1.0.9", None)) is None


def test_as_released_has_no_shared_instant() -> None:
    assert pins_as_of(as_released=True, resolve_at=None, good=GOOD, newest=NEWEST) is None


def test_resolve_at_latest_and_dates() -> None:
    assert parse_resolve_at("latest") is None
    assert parse_resolve_at(" LATEST ") is None
    assert parse_resolve_at("2024-03-01") == datetime(2024, 3, 1, 23, 59, 59, 999999, tzinfo=UTC)
    assert parse_resolve_at("2024-03-01T12:00:00Z") == datetime(2024, 3, 1, 12, tzinfo=UTC)
    assert parse_resolve_at("2024-03-01T12:00") == datetime(2024, 3, 1, 12, tzinfo=UTC)
    when = pins_as_of(as_released=False, resolve_at="2024-06-30", good=GOOD, newest=NEWEST)
    assert when == datetime(2024, 6, 30, 23, 59, 59, 999999, tzinfo=UTC)


def test_resolve_at_before_the_good_bound_is_refused() -> None:
    with pytest.raises(InvalidInput) as caught:
        pins_as_of(as_released=False, resolve_at="2023-12-31", good=GOOD, newest=NEWEST)
    assert str(caught.value) == (
        "2023-12-31 is before the good bound 1.0.0 was uploaded (2024-01-01): "
        "it could not be resolved"
    )
    assert caught.value.field == "resolve_at"


def test_resolve_at_that_is_not_a_date() -> None:
    with pytest.raises(InvalidInput, match="'yesterday' is not a date: write YYYY-MM-DD"):
        parse_resolve_at("yesterday")


def test_the_report_line_says_what_and_why() -> None:
    assert describe(as_released=False, resolve_at=None, as_of=NEWEST[1], newest="1.0.9") == (
        "other packages held at the versions resolved for the good bound as of "
        "2024-01-10 08:30 UTC, when 1.0.9 (the bad bound) was uploaded, so none is newer "
        "than the range (--resolve-at DATE|latest or --as-released to change)"
    )
    assert describe(
        as_released=False, resolve_at="latest", as_of=None, newest="1.0.9"
    ) == ("other packages held at the versions resolved for the good bound against today's "
          "index (--resolve-at latest)")  # fmt: skip
    assert describe(as_released=True, resolve_at=None, as_of=None, newest="1.0.9") == (
        "each candidate resolved as on its own upload day (--as-released)"
    )
    assert "(the fixed bound) has no upload time" in describe(
        as_released=False, resolve_at=None, as_of=None, newest="1.0.9", find_fix=True
    )


# ------------------------------------------------------------------- end to end

CLI = [sys.executable, "-m", "service.cli"]
# How a co-dependency breaks an old release: it reaches for an attribute the release lacks.
CODEP_CHECK = """
def check(version):
    if version == "1.0.0":
        raise AttributeError("module 'leakyfixture' has no attribute 'DeviceLocalLayout'")
"""
CRASHES = (
    "import codep, importlib.metadata\n"
    "codep.check(importlib.metadata.version('leakyfixture'))\n"
)
QUICK = "import codep, leakyfixture\nprint('codep', codep.VERSION)\n"


@pytest.fixture(scope="module")
def index(reachable_dir: Callable[[str], Path]) -> Iterator[str]:
    """The fixture plus `codep` 1.0 (before the range) and 2.0 (after it)."""
    wheels = build_fixture(reachable_dir("resolution-index"))
    meta = json.loads((wheels / "index.json").read_text())
    for version, uploaded in (("1.0", datetime(2023, 12, 1)), ("2.0", datetime(2024, 3, 1))):
        path = pack_wheel(
            wheels / f"codep-{version}-py3-none-any.whl",
            "codep",
            version,
            {"codep/__init__.py": (f"VERSION = {version!r}\n" + CODEP_CHECK).encode()},
            summary="A co-dependency with a release after the range.",
        )
        meta["files"][path.name] = {
            "requires_python": None,
            "yanked": False,
            "upload_time": iso_z(uploaded.replace(tzinfo=UTC)),
        }
    (wheels / "index.json").write_text(json.dumps(meta))
    with serve_index(wheels) as url:
        yield url


def run(
    index: str,
    home: Path,
    uv_cache: Path,
    *extra: str,
    script_text: str = QUICK,
    json_: bool = True,
) -> subprocess.CompletedProcess[str]:
    script = home / "quick.py"
    script.write_text(script_text)
    args = [
        "run", str(script), "--package", "leakyfixture", "--range", "1.0.0..1.0.1",
        "--with", "codep", "--index-url", index, "--max-runs", "1", "--no-reuse",
        "--database-url", f"sqlite:///{home / 'r.db'}", *(["--json"] if json_ else []), *extra,
    ]  # fmt: skip
    env = {
        **os.environ,
        "XDG_DATA_HOME": str(home / "data"),
        "XDG_CACHE_HOME": str(home / "cache"),
        "UV_CACHE_DIR": str(uv_cache),
    }
    return subprocess.run(CLI + args, capture_output=True, text=True, env=env, timeout=300)


def stored_pins(home: Path) -> tuple[list[str], str | None]:
    with sqlite3.connect(home / "r.db") as db:
        constraints, as_of = db.execute("SELECT constraints, pins_as_of FROM job").fetchone()
    return json.loads(constraints), as_of


@pytest.mark.parametrize(
    ("extra", "codep", "as_of"),
    [
        ((), "codep==1.0", "2024-01-02 00:00:00.000000"),  # the bad bound 1.0.1's upload time
        (("--resolve-at", "latest"), "codep==2.0", None),
        (("--resolve-at", "2024-03-01"), "codep==2.0", "2024-03-01 23:59:59.999999"),
    ],
)
def test_co_dependency_resolved_as_of_the_policy(
    index: str,
    reachable_dir: Callable[[str], Path],
    uv_cache: Path,
    extra: tuple[str, ...],
    codep: str,
    as_of: str | None,
) -> None:
    home = reachable_dir("resolution-run")
    proc = run(index, home, uv_cache, *extra)
    # The quick script is too short to judge (exit 4, inconclusive): the pins are the point.
    assert proc.returncode == 4, proc.stderr
    constraints, stored_as_of = stored_pins(home)
    assert codep in constraints
    assert stored_as_of == as_of
    with sqlite3.connect(home / "r.db") as db:
        (freeze,) = db.execute("SELECT freeze FROM candidate WHERE position = 0").fetchone()
    assert codep in json.loads(freeze)  # the good bound was built with the pins
    report = json.loads(proc.stdout)
    assert report["environment"].startswith("other packages held at the versions resolved")


def test_resolve_at_before_the_range_is_one_line(
    index: str, reachable_dir: Callable[[str], Path], uv_cache: Path
) -> None:
    home = reachable_dir("resolution-refused")
    proc = run(index, home, uv_cache, "--resolve-at", "2023-06-01")
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1] == (
        "error: --resolve-at: 2023-06-01 is before the good bound 1.0.0 was uploaded "
        "(2024-01-01): it could not be resolved"
    )


def test_resolve_at_and_as_released_together_are_refused(
    index: str, reachable_dir: Callable[[str], Path], uv_cache: Path
) -> None:
    home = reachable_dir("resolution-both")
    proc = run(index, home, uv_cache, "--resolve-at", "latest", "--as-released")
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1] == (
        "error: --resolve-at: cannot be combined with as released (--as-released): each says "
        "when to resolve; give one"
    )


def test_a_bound_that_crashes_on_import_shows_its_line_and_the_fix(
    index: str, reachable_dir: Callable[[str], Path], uv_cache: Path
) -> None:
    home = reachable_dir("resolution-crash")
    proc = run(index, home, uv_cache, script_text=CRASHES)
    assert proc.returncode == 1, proc.stderr
    report = json.loads(proc.stdout)
    line = "AttributeError: module 'leakyfixture' has no attribute 'DeviceLocalLayout'"
    assert report["status"] == "error"
    # An AttributeError before any step marker: the repro cannot run on this release, a skip
    # (never a leak or a crash to blame), named in the bounds message (issue #23).
    assert report["message"].splitlines() == [
        f"good bound 1.0.0 cannot be tested: the repro cannot run on it ({line})",
        "hint: codep does not fit this release: pin it to a release of the same time "
        "(--with 'codep==VERSION'; this run had codep 1.0) or try --as-released (each "
        "candidate resolved as on its own day)",
    ]
    good = report["candidates"][0]
    assert (good["verdict"], good["error"]) == ("skip", line)
    assert good["reproduce"].startswith("uv venv /tmp/leakbisect-repro")
    assert [e["version"] for e in report["evidence"]] == ["1.0.0"]  # the bad bound never ran
    assert report["evidence"][0]["runs"][0]["error"] == line
    # The text report (no --json) shows the same lines.
    text = run(index, reachable_dir("resolution-crash-text"), uv_cache, script_text=CRASHES,
               json_=False)  # fmt: skip
    assert text.returncode == 1
    shown = " ".join((text.stdout + text.stderr).split())  # Rich wraps long lines
    assert f"good bound 1.0.0 cannot be tested: the repro cannot run on it ({line})" in shown
    assert "hint: codep does not fit this release" in shown
