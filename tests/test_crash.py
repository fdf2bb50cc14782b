"""The crash evidence rules (engine/crash.py): the line shown, the hint given, and whether a
run could run at all (service/trials.py `judge`: the repro cannot run on this release)."""

from types import SimpleNamespace

from contract.wire import EnvResult, TrialReport
from engine.analysis import classify_run
from engine.crash import cannot_run, culprit_package, error_line, hint
from engine.verdicts import Verdict
from service.trials import cannot_run_why, judge

JAX_TRACE = """\
step 0
Traceback (most recent call last):
  File "/tmp/trial/repro.py", line 3, in <module>
    import orbax.checkpoint
  File "/envs/abc/lib/python3.12/site-packages/orbax/checkpoint/__init__.py", line 9, in <module>
    from jax.experimental import layout
  File "/envs/abc/lib/python3.12/site-packages/jax/experimental/layout.py", line 4, in <module>
    DeviceLocalLayout = _src.DeviceLocalLayout
AttributeError: module 'jax.experimental.layout' has no attribute 'DeviceLocalLayout'
"""
FREEZE = ["jax==0.8.1", "orbax-checkpoint==0.11.8", "numpy==2.3.0"]


def test_the_exception_line_is_shown_not_the_last_line() -> None:
    tail = JAX_TRACE + "\nexiting\n"
    assert error_line(tail) == (
        "AttributeError: module 'jax.experimental.layout' has no attribute 'DeviceLocalLayout'"
    )


def test_without_an_exception_the_last_words() -> None:
    assert error_line("loading\nSegmentation fault (core dumped)\n\n") == (
        "Segmentation fault (core dumped)"
    )
    assert error_line("") is None
    assert error_line(None) is None


def test_the_culprit_is_the_last_frame_outside_the_bisected_package() -> None:
    assert culprit_package(JAX_TRACE, "orbax-checkpoint") == "jax"
    assert culprit_package("AttributeError: x\n", "orbax-checkpoint") is None


def test_co_dependency_hint_names_it_and_its_version() -> None:
    line = error_line(JAX_TRACE)
    got = hint(line, JAX_TRACE, bisected="orbax-checkpoint", freeze=FREEZE, shared_pins=True)
    assert got == (
        "jax does not fit this release: pin it to a release of the same time "
        "(--with 'jax==VERSION'; this run had jax 0.8.1) or try --as-released "
        "(each candidate resolved as on its own day)"
    )
    as_released = hint(line, JAX_TRACE, bisected="orbax", freeze=FREEZE, shared_pins=False)
    assert as_released == (
        "jax does not fit this release: pin it to a release of the same time "
        "(--with 'jax==VERSION'; this run had jax 0.8.1)"
    )


def test_import_error_without_a_frame_gives_the_general_advice() -> None:
    line = "ImportError: cannot import name 'Layout' from 'jax'"
    assert hint(line, line, bisected="orbax", freeze=[], shared_pins=True) == (
        "a co-dependency does not fit this release: pin it with --with 'NAME==VERSION' "
        "or try --as-released (each candidate resolved as on its own day)"
    )


def test_missing_module_suggests_with() -> None:
    line = "ModuleNotFoundError: No module named 'jax'"
    assert hint(line, line, bisected="orbax", freeze=[], shared_pins=True) == (
        "the repro imports jax, which nothing installs: add it with --with jax "
        "(its package name may differ)"
    )


def test_the_bisected_package_missing_asks_for_the_import_name() -> None:
    line = "ModuleNotFoundError: No module named 'orbax_checkpoint'"
    assert hint(line, line, bisected="orbax-checkpoint", freeze=[], shared_pins=True) == (
        "this release of orbax-checkpoint installs no module orbax_checkpoint: "
        "does the repro import it under another name?"
    )


def test_a_missing_submodule_is_a_version_mismatch() -> None:
    tail = (
        '  File "/e/lib/python3.12/site-packages/jax/__init__.py", line 1, in <module>\n'
        "ModuleNotFoundError: No module named 'jax.experimental.layout'\n"
    )
    got = hint(error_line(tail), tail, bisected="orbax", freeze=FREEZE, shared_pins=False)
    assert got == (
        "jax does not fit this release: pin it to a release of the same time "
        "(--with 'jax==VERSION'; this run had jax 0.8.1)"
    )


def test_syntax_and_memory_errors() -> None:
    assert hint("SyntaxError: invalid syntax", "", bisected="x", freeze=[], shared_pins=True) == (
        "the script does not parse under this Python: choose one with --python"
    )
    assert hint("MemoryError", "", bisected="x", freeze=[], shared_pins=True) == (
        "the script ran out of memory below the cap: raise --memory-limit"
    )
    assert hint("RuntimeError: boom", "", bisected="x", freeze=[], shared_pins=True) is None
    assert hint(None, "", bisected="x", freeze=[], shared_pins=True) is None


# --- the repro cannot run on this release (service/trials.py `judge`) -----------------------

NEW_API = """\
Traceback (most recent call last):
  File "/tmp/trial/repro.py", line 9, in <module>
    leakyfixture.new_api()
AttributeError: module 'leakyfixture' has no attribute 'new_api'
"""
MIB = 1024 * 1024


def _ramp_report(log_tail: str, steps: list[tuple[float, int]], exit_code: int = 1) -> TrialReport:
    """An import ramp, 100 to 400 MiB over 5 s, then the crash."""
    samples = [{"t": i / 10, "rss": (100 + 6 * i) * MIB} for i in range(51)]
    return TrialReport.model_validate({
        "trial_id": 1, "env": EnvResult(ok=True).model_dump(), "exit_code": exit_code,
        "log_tail": log_tail, "samples": samples, "steps": steps,
    })  # fmt: skip


def _judge(report: TrialReport) -> tuple[Verdict, dict]:
    return judge(SimpleNamespace(classifier={}), report)  # type: ignore[arg-type]


def test_cannot_run_names_import_and_attribute_errors_only() -> None:
    assert cannot_run(NEW_API) == "AttributeError: module 'leakyfixture' has no attribute 'new_api'"
    assert cannot_run(JAX_TRACE) == (
        "AttributeError: module 'jax.experimental.layout' has no attribute 'DeviceLocalLayout'"
    )
    missing = "Traceback (most recent call last):\nModuleNotFoundError: No module named 'jax'\n"
    assert cannot_run(missing) == "ModuleNotFoundError: No module named 'jax'"
    assert cannot_run("ImportError: cannot import name 'args' from 'orbax.checkpoint'") == (
        "ImportError: cannot import name 'args' from 'orbax.checkpoint'"
    )
    assert cannot_run("Traceback (most recent call last):\nValueError: bad shape\n") is None
    assert cannot_run("Segmentation fault (core dumped)") is None
    assert cannot_run(None) is None


def test_an_import_crash_before_the_first_marker_is_a_skip_never_a_leak() -> None:
    report = _ramp_report(NEW_API, steps=[])
    # What the classifier alone says of it: a rising floor and a crash, a leak.
    t, rss = [s.t for s in report.samples], [s.rss for s in report.samples]
    alone = classify_run(t, rss, None, exit_code=1, oom_killed=False, timed_out=False)
    assert alone.verdict is Verdict.LEAK
    line = "AttributeError: module 'leakyfixture' has no attribute 'new_api'"
    assert _judge(report) == (
        Verdict.SKIP,
        {
            "verdict": "skip",
            "reason": f"the repro cannot run on this release ({line})",
            "cannot_run": line,
        },
    )
    assert cannot_run_why(_judge(report)[1]) == f"the repro cannot run on it ({line})"


def test_a_crash_after_a_marker_is_judged_as_before() -> None:
    # A marker came: the script ran; the crash is what the classifier says (here the
    # rising floor after the marker and crash_leak_is_leak: a leak).
    report = _ramp_report(NEW_API, steps=[(0.3, 1)])
    verdict, analysis = _judge(report)
    assert verdict is Verdict.LEAK
    assert "cannot_run" not in analysis
    # Other crashes before any marker are not affected either.
    other = _ramp_report("Traceback (most recent call last):\nValueError: bad\n", steps=[])
    assert _judge(other)[0] is Verdict.LEAK
    # Nor a run that exits 0, or that the cap, the timeout or early stopping ended.
    assert _judge(_ramp_report(NEW_API, steps=[], exit_code=0))[0] is not Verdict.SKIP
    for how in ({"oom_killed": True}, {"timed_out": True}, {"stopped_early": "floor grew"}):
        report = _ramp_report(NEW_API, steps=[]).model_copy(update=how)
        assert "cannot_run" not in _judge(report)[1], how
    assert cannot_run_why({"reason": "environment failed: x"}) is None


def test_the_hint_for_a_release_older_than_the_api_the_repro_uses() -> None:
    line = error_line(NEW_API)
    assert hint(line, NEW_API, bisected="leakyfixture", freeze=[], shared_pins=True) == (
        "this release of leakyfixture has no new_api, which the repro uses: start the range "
        "at a release that has it"
    )
    orbax = "ImportError: cannot import name 'args' from 'orbax.checkpoint' (/x/__init__.py)"
    assert hint(orbax, orbax, bisected="orbax-checkpoint", freeze=[], shared_pins=False) == (
        "this release of orbax-checkpoint has no args, which the repro uses: start the range "
        "at a release that has it"
    )
    # Raised inside another package: that co-dependency is the one to pin (rule 3).
    assert hint(line, JAX_TRACE, bisected="leakyfixture", freeze=FREEZE, shared_pins=False) == (
        "jax does not fit this release: pin it to a release of the same time "
        "(--with 'jax==VERSION'; this run had jax 0.8.1)"
    )
