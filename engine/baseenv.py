"""The user's own environment as a job's pins (`--base-env FILE`). Pure: no I/O.

"My training environment, but with each release of the package": every candidate gets
exactly the versions of a file the user made from that environment, with only the
bisected package swapped (runners/envs.py installs them all, held as constraints, and
records any pin a candidate forces). The file's text travels in the job and is untrusted,
so it is parsed here, on the API server, into `name==version` pins and nothing else:
nothing in it is fetched, followed or built. The same parser reads `--from`/`--to`'s two
environments; which of these a job has is its environment policy (service/envpolicy.py).

Rules, in code order:

1. At most 1 MiB and 5000 packages.
2. The format comes from the file name when it says (`uv.lock`, `pylock*.toml`), else
   from the content (a TOML lock has `[[package]]` or `[[packages]]` tables), else it is
   a freeze / requirements file.
3. Freeze / requirements: one `name==version` a line (extras are dropped: they name no
   version); comments, blank lines, `--hash` and other pip options are ignored, and `-e`
   lines (the user's own editable checkout) are skipped. Refused, naming the line: a
   direct reference (URL, VCS, local path), any specifier but one exact `==` version, an
   environment marker, `-r`/`-c` (another file), and index options (give them as
   `--index-url`/`--extra-index-url`/`--find-links`).
4. `uv.lock`: every `[[package]]` with a registry source; the virtual or editable root
   project and any other source (git, path, URL) are skipped.
5. `pylock.toml` (PEP 751): every `[[packages]]` entry with a version and no `vcs`,
   `directory` or `archive` source.
6. Names are normalised (PEP 503). One name at two versions (a lock forked by platform)
   is refused: pass a freeze of the environment itself.
7. The bisected package's own pin is split off: it is what each candidate replaces.
"""

import re
import tomllib
from dataclasses import dataclass

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from contract.errors import InvalidInput

FIELD = "base_env"
MAX_BYTES = 1024 * 1024
MAX_PACKAGES = 5000
FREEZE, UV_LOCK, PYLOCK = "freeze", "uv.lock", "pylock.toml"
# The start of a candidate's `resolution_note` when it had to leave some base pins.
FORCED_NOTE = "base env, except"

# pip options that would make the build read another file or another index.
INCLUDES = ("-r", "--requirement", "-c", "--constraint")
INDEXES = ("-i", "--index-url", "--extra-index-url", "-f", "--find-links")
DIRECT = re.compile(r"^(\.|/|~|[A-Za-z][A-Za-z0-9+.-]*://|git\+|hg\+|svn\+|bzr\+|file:)")


@dataclass(frozen=True)
class BaseEnv:
    """A parsed base environment: its format and its pins, normalised name -> version."""

    format: str
    pins: dict[str, str]

    def split(self, package: str) -> tuple[list[str], str | None]:
        """The pins of everything but `package` (sorted), and `package`'s own version."""
        own = canonicalize_name(package)
        others = [f"{name}=={v}" for name, v in sorted(self.pins.items()) if name != own]
        return others, self.pins.get(own)


def fail(message: str, field: str = FIELD) -> InvalidInput:
    return InvalidInput(message, field=field)


def parse(text: str, name: str | None = None, *, field: str = FIELD) -> BaseEnv:
    """The pins of a base environment file's text (`name`: its file name, when known);
    `field`: the option errors name (--base-env, --from, --to)."""
    try:
        return _parse(text, name)
    except InvalidInput as exc:
        if field == FIELD:
            raise
        raise fail(exc.message, field) from None


def _parse(text: str, name: str | None) -> BaseEnv:
    if len(text.encode()) > MAX_BYTES:
        raise fail("the base environment is larger than 1 MiB")
    kind = detect(text, name)
    pairs = {UV_LOCK: _uv_lock, PYLOCK: _pylock}.get(kind, _freeze)(text)
    pins: dict[str, str] = {}
    for raw_name, version in pairs:
        key = canonicalize_name(raw_name)
        if pins.get(key, version) != version:
            raise fail(
                f"{key} is listed at {pins[key]} and {version} (a lock for several "
                "platforms?); pass a `uv pip freeze` of the environment itself"
            )
        pins[key] = version
    if len(pins) > MAX_PACKAGES:
        raise fail(f"at most {MAX_PACKAGES} packages, got {len(pins)}")
    if not pins:
        raise fail(f"no pinned packages found (read as {kind})")
    return BaseEnv(kind, pins)


def detect(text: str, name: str | None) -> str:
    base = (name or "").replace("\\", "/").rsplit("/", 1)[-1].lower()
    if base == "uv.lock":
        return UV_LOCK
    if base.startswith("pylock") and base.endswith(".toml"):
        return PYLOCK
    if re.search(r"^\[\[package\]\]\s*$", text, re.M):
        return UV_LOCK
    if re.search(r"^\[\[packages\]\]\s*$", text, re.M):
        return PYLOCK
    return FREEZE


def _freeze(text: str) -> list[tuple[str, str]]:
    pairs = []
    for number, line in _logical_lines(text):
        if line.startswith("-"):
            _option(number, line)
            continue
        pairs.append(_pin(number, line))
    return pairs


def _logical_lines(text: str) -> list[tuple[int, str]]:
    """(first line number, text) with comments stripped and `\\` continuations joined."""
    out: list[tuple[int, str]] = []
    pending: tuple[int, str] | None = None
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.split(" #", 1)[0].strip() if not raw.lstrip().startswith("#") else ""
        if pending is not None:
            number, line = pending[0], f"{pending[1]} {line}"
        pending = (number, line[:-1].strip()) if line.endswith("\\") else None
        if pending is None and line.strip():
            out.append((number, line.strip()))
    if pending is not None and pending[1]:
        out.append(pending)
    return out


def _option(number: int, line: str) -> None:
    word = re.split(r"[\s=]", line, maxsplit=1)[0]
    if word in INCLUDES:
        raise fail(f"line {number}: {word} includes another file; pass one `uv pip freeze`")
    if word in INDEXES:
        raise fail(
            f"line {number}: {word} names an index; give it as --index-url, "
            "--extra-index-url or --find-links instead"
        )
    # -e (the user's own checkout), --hash, --no-binary and the like name no version.


def _pin(number: int, line: str) -> tuple[str, str]:
    text = re.sub(r"\s--hash[=\s]\S+", "", f" {line}").strip()
    if DIRECT.match(text) or " @ " in text or text.split("@", 1)[0] != text:
        raise fail(
            f"line {number}: {_short(text)} is a direct reference (URL, VCS or local path), "
            "which is never built from a job; pin it to a version on an index"
        )
    try:
        req = Requirement(text)
    except InvalidRequirement as exc:
        reason = str(exc).splitlines()[0] if str(exc) else "invalid"
        raise fail(f"line {number}: {_short(text)} does not parse: {reason}") from None
    if req.marker is not None:
        raise fail(
            f"line {number}: {_short(text)} has an environment marker; pass a "
            "`uv pip freeze` of the environment itself"
        )
    specs = list(req.specifier)
    if len(specs) != 1 or specs[0].operator != "==" or "*" in specs[0].version:
        raise fail(
            f"line {number}: {_short(text)} is not an exact pin (name==version); pass a "
            "`uv pip freeze` (or `pip freeze`) of the environment"
        )
    return req.name, _version(specs[0].version, req.name)


def _uv_lock(text: str) -> list[tuple[str, str]]:
    pairs = []
    for entry in _toml(text, UV_LOCK).get("package", []):
        source = entry.get("source") if isinstance(entry, dict) else None
        if not isinstance(source, dict) or "registry" not in source:
            continue  # the root project (virtual/editable), git, path, URL
        pairs.append(_entry(entry, UV_LOCK))
    return pairs


def _pylock(text: str) -> list[tuple[str, str]]:
    pairs = []
    for entry in _toml(text, PYLOCK).get("packages", []):
        if not isinstance(entry, dict) or "version" not in entry:
            continue
        if any(key in entry for key in ("vcs", "directory", "archive")):
            continue
        pairs.append(_entry(entry, PYLOCK))
    return pairs


def _toml(text: str, kind: str) -> dict:
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise fail(f"not a valid {kind}: {str(exc).splitlines()[0]}") from None


def _entry(entry: dict, kind: str) -> tuple[str, str]:
    name, version = entry.get("name"), entry.get("version")
    if not isinstance(name, str) or not isinstance(version, str):
        raise fail(f"a package in the {kind} has no name or version")
    if not re.fullmatch(r"[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?", name):
        raise fail(f"{_short(name)} in the {kind} is not a package name")
    return name, _version(version, name)


def _version(version: str, name: str) -> str:
    try:
        return str(Version(version))
    except InvalidVersion:
        raise fail(f"{_short(name)}: {_short(version)} is not a version") from None


def _short(text: str) -> str:
    return repr(text if len(text) <= 80 else text[:77] + "...")


def describe(base: BaseEnv, *, package: str, source: str | None) -> str:
    """The report's "environment" line for a job with a base environment."""
    others, own = base.split(package)
    where = f"from {source}" if source else f"in a {base.format}"
    count = f"{len(others)} package{'' if len(others) == 1 else 's'}"
    line = f"your base environment ({count} {where})"
    if own is not None:
        line += f", which had {canonicalize_name(package)} {own}; each candidate swaps in its own"
    return line + ", with what a candidate forces noted on its row"
