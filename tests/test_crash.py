"""The crash evidence rules (service/crash.py): the line shown and the hint given."""

from service.crash import culprit_package, error_line, hint

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
