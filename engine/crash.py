"""What a crashed run says: the line to show, whether the repro could run at all, and the
fix to suggest. Pure: no I/O.

`error_line` picks, from a run's log tail, the line a user would look for: the last
exception line (`AttributeError: module ... has no attribute ...`), else the last line
that is not blank. `cannot_run` says whether that line means the repro cannot run on the
release: an `ImportError` (`ModuleNotFoundError` too) or an `AttributeError`, which is
what a release older (or newer) than the API the repro or a co-dependency uses raises;
service/trials.py makes such a run a skip when it came before the first step marker.
`hint` suggests the fix that fits the line, by these rules in order:

1. `No module named X` for a top-level X: the repro needs X and nothing installs it:
   `--with X` (the import name may differ from the package); X the bisected package
   itself: the release installs no such module (another import name?).
2. `ImportError` or `AttributeError` naming the bisected package as what lacks the name
   (`module 'X' has no attribute 'Y'`, `cannot import name 'Y' from 'X'`) and raised
   outside any other installed package: the release is older (or newer) than the API
   the repro uses; start the range at a release that has it.
3. `ImportError` (a missing submodule too) or `AttributeError` raised from inside an
   installed package other than the bisected one (the traceback's last site-packages
   frame names it): that co-dependency is too new or too old for this release. Pin it
   (`--with 'NAME==VERSION'`, this run had VERSION); with shared pins in force (the
   default, `--resolve-at`) `--as-released` resolves each candidate as on its own day.
4. `ImportError` / `AttributeError` anywhere else: the same advice, without a name.
5. `SyntaxError`: the script does not parse under the environment's Python (`--python`).
6. `MemoryError`: the script ran out of memory below the cap (`--memory-limit`).
7. Otherwise no hint: the line speaks for itself.
"""

import re

from packaging.utils import canonicalize_name

EXCEPTION_LINE = re.compile(
    r"^(?P<name>[A-Za-z_][\w.]*(?:Error|Exception|Exit|Interrupt|Fault|Warning))(?::.*)?$"
)
# Exceptions a release raises when it lacks what the repro uses (a module, a name).
CANNOT_RUN = ("ImportError", "ModuleNotFoundError", "AttributeError")
NO_MODULE = re.compile(r"No module named '?(?P<module>[\w.]+)'?")
# `module 'X' has no attribute 'Y'`, `cannot import name 'Y' from 'X' (...)`
NO_ATTRIBUTE = re.compile(r"module '(?P<module>[\w.]+)' has no attribute '(?P<name>\w+)'")
NO_NAME = re.compile(r"cannot import name '(?P<name>\w+)' from '(?P<module>[\w.]+)'")
# `File "/.../site-packages/jax/_src/foo.py", line 3, in <module>`
SITE_FRAME = re.compile(r'File "[^"]*/(?:site|dist)-packages/(?P<top>[A-Za-z0-9_]+)[/.]')


def error_line(log_tail: str | None) -> str | None:
    """The exception line of a crashed run's output, else its last non-blank line."""
    if not log_tail:
        return None
    lines = [line.strip() for line in log_tail.splitlines() if line.strip()]
    for line in reversed(lines):
        if EXCEPTION_LINE.match(line):
            return line
    return lines[-1] if lines else None


def cannot_run(log_tail: str | None) -> str | None:
    """The error line when it is an ImportError, ModuleNotFoundError or AttributeError."""
    line = error_line(log_tail)
    exception = EXCEPTION_LINE.match(line or "")
    if exception is None:
        return None
    name = exception.group("name").rsplit(".", 1)[-1]
    return line if name in CANNOT_RUN else None


def culprit_package(log_tail: str, bisected: str) -> str | None:
    """The installed package the traceback's last frame outside the bisected one is in."""
    frames = [m.group("top") for m in SITE_FRAME.finditer(log_tail)]
    others = [f for f in frames if canonicalize_name(f) != canonicalize_name(bisected)]
    return others[-1] if others else None


def hint(
    line: str | None,
    log_tail: str,
    *,
    bisected: str,
    freeze: list[str],
    shared_pins: bool,
) -> str | None:
    """The fix that fits `line` (see the rules above), or None."""
    if line is None:
        return None
    exception = EXCEPTION_LINE.match(line)
    name = exception.group("name") if exception else ""
    missing = NO_MODULE.search(line)
    if missing and "." not in missing.group("module"):
        module = missing.group("module")
        if _top(module) == canonicalize_name(bisected):
            return (
                f"this release of {bisected} installs no module {module}: "
                "does the repro import it under another name?"
            )
        return (
            f"the repro imports {module}, which nothing installs: add it with --with {module} "
            "(its package name may differ)"
        )
    if name.endswith(("ImportError", "AttributeError", "ModuleNotFoundError")):
        other = culprit_package(log_tail, bisected)
        lacking = NO_ATTRIBUTE.search(line) or NO_NAME.search(line)
        if other is None and lacking and _names_package(lacking.group("module"), bisected):
            return (
                f"this release of {bisected} has no {lacking.group('name')}, which the repro "
                "uses: start the range at a release that has it"
            )
        also = " or try --as-released (each candidate resolved as on its own day)"
        also = also if shared_pins else ""
        if other is None:
            return (
                f"a co-dependency does not fit this release: pin it with "
                f"--with 'NAME==VERSION'{also}"
            )
        had = _version_in(freeze, other)
        had_text = f"; this run had {other} {had}" if had else ""
        return (
            f"{other} does not fit this release: pin it to a release of the same time "
            f"(--with '{other}==VERSION'{had_text}){also}"
        )
    if name.endswith("SyntaxError"):
        return "the script does not parse under this Python: choose one with --python"
    if name.endswith("MemoryError"):
        return "the script ran out of memory below the cap: raise --memory-limit"
    return None


def _names_package(module: str, package: str) -> bool:
    """Whether an import path is the package's (`orbax.checkpoint` is orbax-checkpoint's)."""
    wanted = canonicalize_name(package)
    return _top(module) == wanted or canonicalize_name(module) == wanted


def _top(module: str) -> str:
    return canonicalize_name(module.split(".")[0])


def _version_in(freeze: list[str], package: str) -> str | None:
    wanted = canonicalize_name(package)
    for pin in freeze:
        name, sep, version = pin.partition("==")
        if sep and canonicalize_name(name) == wanted:
            return version.strip()
    return None
