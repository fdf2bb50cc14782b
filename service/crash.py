"""What a crashed run says: the line to show, and the fix to suggest. Pure: no I/O.

`error_line` picks, from a run's log tail, the line a user would look for: the last
exception line (`AttributeError: module ... has no attribute ...`), else the last line
that is not blank. `hint` suggests the fix that fits that line, by these rules in order:

1. `No module named X` for a top-level X: the repro needs X and nothing installs it:
   `--with X` (the import name may differ from the package); X the bisected package
   itself: the release installs no such module (another import name?).
2. `ImportError` (a missing submodule too) or `AttributeError` raised from inside an
   installed package other than the bisected one (the traceback's last site-packages
   frame names it): that co-dependency is too new or too old for this release. Pin it
   (`--with 'NAME==VERSION'`, this run had VERSION); with shared pins in force (the
   default, `--resolve-at`) `--as-released` resolves each candidate as on its own day.
3. `ImportError` / `AttributeError` anywhere else: the same advice, without a name.
4. `SyntaxError`: the script does not parse under the environment's Python (`--python`).
5. `MemoryError`: the script ran out of memory below the cap (`--memory-limit`).
6. Otherwise no hint: the line speaks for itself.
"""

import re

from packaging.utils import canonicalize_name

EXCEPTION_LINE = re.compile(
    r"^(?P<name>[A-Za-z_][\w.]*(?:Error|Exception|Exit|Interrupt|Fault|Warning))(?::.*)?$"
)
NO_MODULE = re.compile(r"No module named '?(?P<module>[\w.]+)'?")
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


def _top(module: str) -> str:
    return canonicalize_name(module.split(".")[0])


def _version_in(freeze: list[str], package: str) -> str | None:
    wanted = canonicalize_name(package)
    for pin in freeze:
        name, sep, version = pin.partition("==")
        if sep and canonicalize_name(name) == wanted:
            return version.strip()
    return None
