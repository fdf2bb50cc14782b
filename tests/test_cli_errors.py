"""Bad input to `bisect-cli run`: one line on stderr, exit 2, no traceback, nothing on stdout."""

import importlib
import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from service.cli import app

REPRO = str(Path(__file__).resolve().parents[1] / "service" / "example" / "repro.py")


@pytest.fixture
def invoke(
    tmp_path: Path, reachable_tmp: Path, fixture_index: str, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    # Environments must be reachable by the build and trial users (the runner checks first).
    monkeypatch.setenv("XDG_CACHE_HOME", str(reachable_tmp / "cache"))
    from service.settings import get_settings

    get_settings.cache_clear()

    def run(*args: str) -> tuple[int, str, str]:
        argv = ["run", *[a.replace("{INDEX}", fixture_index) for a in args], "--json"]
        result = CliRunner().invoke(app, argv)
        return result.exit_code, result.stdout, result.stderr

    yield run
    get_settings.cache_clear()


CASES = [
    (
        [REPRO, "--package", "nopkg", "--range", "1..2", "--index-url", "{INDEX}"],
        "error: package 'nopkg' not found on {INDEX} (404)",
    ),
    (
        [REPRO, "--package", "leakyfixture", "--range", "1.0.0..1.0.99", "--index-url", "{INDEX}"],
        "error: --range: version 1.0.99 of leakyfixture does not exist; nearest: 1.0.8, 1.0.9",
    ),
    (
        [REPRO, "--package", "leakyfixture", "--range", "1.0.6..1.0.2", "--index-url", "{INDEX}"],
        "error: --range: range is reversed: 1.0.6 is newer than 1.0.2; write OLD..NEW",
    ),
    (
        [REPRO, "--package", "leakyfixture", "--range", "1.0.2..1.0.2", "--index-url", "{INDEX}"],
        "error: --range: range 1.0.2..1.0.2 holds only 1 release; a bisection needs at least 2",
    ),
    (
        [REPRO, "--package", "leakyfixture", "--range", "1.0.0", "--index-url", "{INDEX}"],
        "error: --range: '1.0.0' is not a range; write GOOD..BAD, e.g. 1.0.0..1.0.9",
    ),
    (
        ["nope.py", "--package", "leakyfixture", "--range", "1.0.0..1.0.9"],
        "error: SCRIPT: nope.py does not exist or is not a file",
    ),
    (
        [
            REPRO,
            "--package",
            "leakyfixture",
            "--range",
            "1.0.0..1.0.9",
            "--index-url",
            "http://127.0.0.1:9/simple",
        ],
        "error: cannot reach index http://127.0.0.1:9/simple: connection refused",
    ),
    (
        [REPRO, "--package", "leakyfixture", "--range", "1.0.0..1.0.9", "--python", "3.99"],
        "error: --python: python 3.99 is not available: No interpreter found for Python 3.99 "
        "in virtual environments, managed installations, or search path",
    ),
    (
        [REPRO, "--package", "leakyfixture", "--range", "1.0.0..1.0.9", "--memory-limit", "12X"],
        "error: --memory-limit: '12X' is not a positive size such as 4G, 512MiB, 1.5GB "
        "or a byte count",
    ),
    (
        [REPRO, "--package", "leakyfixture", "--range", "1.0.0..1.0.9", "--with", "foo>="],
        "error: --with/-r: requirement 'foo>=' does not parse: Expected semicolon "
        "(after name with no version specifier) or end",
    ),
    (
        [REPRO, "--range", "1.0.0..1.0.9"],
        "error: --package: missing; name the package whose releases to bisect",
    ),
    (
        [REPRO, "--package", "leakyfixture", "--range", "1.0.0..1.0.9", "-r", "missing.txt"],
        "error: -r: cannot read missing.txt: No such file or directory",
    ),
]


@pytest.mark.parametrize(("args", "message"), CASES)
def test_bad_input_is_one_line_and_exit_2(invoke, fixture_index: str, args, message) -> None:
    code, stdout, stderr = invoke(*args)
    assert code == 2
    assert stdout == ""
    assert stderr == message.replace("{INDEX}", fixture_index) + "\n"


def boom(*args, **kwargs):
    raise RuntimeError("boom")


def test_unexpected_failure_is_one_line_and_exit_1(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import service.cli

    run_module = importlib.import_module("service.cli.run")  # `service.cli.run` is the command
    monkeypatch.delenv("BISECT_DEBUG", raising=False)
    monkeypatch.setattr(run_module, "build_request", boom)
    monkeypatch.setattr("sys.argv", ["bisect-cli", "run", REPRO, "-p", "x", "--range", "1..2"])
    with pytest.raises(SystemExit) as exit_:
        service.cli.main()
    assert exit_.value.code == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == (
        "internal error: RuntimeError: boom\n(set BISECT_DEBUG=1 to see the traceback)\n"
    )


def test_bisect_debug_shows_the_traceback(monkeypatch: pytest.MonkeyPatch) -> None:
    import service.cli

    run_module = importlib.import_module("service.cli.run")  # `service.cli.run` is the command
    monkeypatch.setenv("BISECT_DEBUG", "1")
    monkeypatch.setattr(run_module, "build_request", boom)
    monkeypatch.setattr("sys.argv", ["bisect-cli", "run", REPRO, "-p", "x", "--range", "1..2"])
    with pytest.raises(RuntimeError, match="boom"):
        service.cli.main()


def test_a_bad_setting_is_one_line_naming_its_variable():
    result = subprocess.run(
        [sys.executable, "-m", "service.cli", "run"],
        env={**os.environ, "BISECT_GPU_EXCLUSIVE": "maybe"},
        capture_output=True,
        text=True,
    )
    assert result.returncode == 2
    assert result.stderr == "error: BISECT_GPU_EXCLUSIVE: Input should be 'auto', 'yes' or 'no'\n"


ENV_CASES = [
    (["--from", "g.txt"], "--to: give both --from (the good environment) and --to (the bad "
     "one), or neither"),
    (["--to", "b.txt"], "--to: give both --from (the good environment) and --to (the bad "
     "one), or neither"),
    (["--from", "g.txt", "--to", "b.txt", "--package", "x"], "--package: not with --from/--to: "
     "the two environments say which packages changed, and the search finds the culprit"),
    (["--from", "g.txt", "--to", "b.txt", "--range", "1..2"], "--range: not with --from/--to: "
     "the two environments are the range"),
    (["--from", "g.txt", "--to", "g.txt"], "--to: the two environments pin the same versions: "
     "there is no change to blame"),
    (["--from", "missing.txt", "--to", "b.txt"], "--from: cannot read missing.txt: No such file "
     "or directory"),
    (["--from", "g.txt", "--to", "url.txt"], "--to: line 1: 'a @ https://x/y.whl' is a direct "
     "reference (URL, VCS or local path), which is never built from a job; pin it to a version "
     "on an index"),
    (["--from", "g.txt", "--to", "b.txt", "--find-fix"], "--find-fix: cannot be combined with "
     "--from/--to, which find what makes the good environment leak"),
    (["--from", "g.txt", "--to", "b.txt", "--base-env", "g.txt"], "--base-env: cannot be "
     "combined with --from/--to: --from is the base environment"),
    (["--from", "g.txt", "--to", "b.txt", "--as-released"], "--as-released: cannot be combined "
     "with --from/--to: the two environments hold every version already"),
    (["--package", "leakyfixture", "--range", "1.0.0..1.0.9", "--repo", "/tmp"], "--repo: only "
     "with --commits, which bisects the repository's commits"),
]  # fmt: skip


@pytest.mark.parametrize(("args", "message"), ENV_CASES)
def test_bad_from_to_is_one_line_and_exit_2(
    invoke, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, args: list[str], message: str
) -> None:
    (tmp_path / "g.txt").write_text("a==1\nb==2\n")
    (tmp_path / "b.txt").write_text("a==1\nb==3\n")
    (tmp_path / "url.txt").write_text("a @ https://x/y.whl\n")
    monkeypatch.chdir(tmp_path)
    code, stdout, stderr = invoke(REPRO, *args)
    assert (code, stdout, stderr) == (2, "", f"error: {message}\n")
