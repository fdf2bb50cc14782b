"""The user's own environment as a job's pins (`--base-env FILE`). Pure: no I/O.

"My training environment, but with each release of the package": every candidate gets
exactly the versions of a file the user made from that environment, with only the
bisected package swapped (runners/envs.py installs them all, held as constraints, and
records any pin a candidate forces). The file's text travels in the job and is untrusted,
so it is parsed here, on the API server, into `name==version` pins and nothing else:
nothing in it is fetched, followed or built. The same parser reads `--from`/`--to`'s two
environments; which of these a job has is its environment policy (service/envpolicy.py).

Every step is linear in the file's size and every limit is checked before the work it
bounds, so a hostile file costs no more than a valid one of its size (the API still
parses it in a worker thread, never on the event loop: service/api/routes/jobs.py).

Rules, in code order:

1. Text of at most 1 MiB (`MAX_BYTES`), no NUL and no lone surrogate, in at most
   50 000 lines (`MAX_LINES`) of at most 64 Ki characters each (`MAX_LINE`).
2. The format comes from the file name when it says (`uv.lock`, `pylock*.toml`), else
   from the content (a TOML lock has `[[package]]` or `[[packages]]` tables), else it is
   a freeze / requirements file.
3. Freeze / requirements: one `name==version` a line (extras are dropped: they name no
   version); comments, blank lines, `--hash` and other pip options are ignored, and `-e`
   lines (the user's own editable checkout) are skipped. A line and its `\\`
   continuations are joined once, to at most `MAX_LINE` characters; at most
   `MAX_PACKAGES` pin lines, each pin (its hashes dropped) at most `MAX_PIN` characters.
   Refused, naming the line: a direct reference (URL, VCS, local path), any specifier but
   one exact `==` version, an environment marker, `-r`/`-c` (another file), and index
   options (give them as `--index-url`/`--extra-index-url`/`--find-links`).
4. A TOML lock nests at most `MAX_DEPTH` levels (arrays, inline tables, dotted keys),
   checked by a scan before tomllib reads it (tomllib recurses on nested values and is
   quadratic in a dotted key's length). Every field read from it must have its TOML type
   (`package` an array of tables, `name` a string, ...): a wrong one is refused naming
   the field and, where it can be found, the line.
5. `uv.lock`: every `[[package]]` with a registry source; the virtual or editable root
   project and any other source (git, path, URL) are skipped.
6. `pylock.toml` (PEP 751): every `[[packages]]` entry with a version and no `vcs`,
   `directory` or `archive` source.
7. Names are normalised (PEP 503). One name at two versions (a lock forked by platform)
   is refused: pass a freeze of the environment itself. At most `MAX_PACKAGES` packages.
8. The bisected package's own pin is split off: it is what each candidate replaces.
"""

import re
import tomllib
from dataclasses import dataclass
from datetime import date, datetime, time
from typing import Any

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from contract.errors import InvalidInput

FIELD = "base_env"
MAX_BYTES = 1024 * 1024
# A real freeze, requirements file or lock of 1 MiB has 15 to 250 bytes a line.
MAX_LINES = 50_000
# A pip-compile line with every wheel's --hash is a few KiB; a uv.lock line a few hundred.
MAX_LINE = 64 * 1024
# name[extras]==version: the longest real one is well under 200.
MAX_PIN = 1000
# uv.lock and pylock.toml nest 3 levels; tomllib recurses about 3 frames a level.
MAX_DEPTH = 32
MAX_PACKAGES = 5000
FREEZE, UV_LOCK, PYLOCK = "freeze", "uv.lock", "pylock.toml"
# The start of a candidate's `resolution_note` when it had to leave some base pins.
FORCED_NOTE = "base env, except"

# pip options that would make the build read another file or another index.
INCLUDES = ("-r", "--requirement", "-c", "--constraint")
INDEXES = ("-i", "--index-url", "--extra-index-url", "-f", "--find-links")
DIRECT = re.compile(r"^(\.|/|~|[A-Za-z][A-Za-z0-9+.-]*://|git\+|hg\+|svn\+|bzr\+|file:)")
NAME = r"[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?"
# The form every pin has, `name[extras]==version` (parenthesised or not), matched in C:
# packaging's parser takes ~5 µs a character of extras, so it reads only a line this
# does not match, to say why it is refused.
EXACT = re.compile(
    rf"({NAME})\s*(?:\[\s*(?:{NAME}(?:\s*,\s*{NAME})*)?\s*\])?\s*"
    r"(?:\(\s*==\s*([A-Za-z0-9._+!-]+)\s*\)|==\s*([A-Za-z0-9._+!-]+))"
)


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
    lines = _lines(text)
    kind = detect(text, name)
    pairs = _freeze(lines) if kind == FREEZE else _lock(text, kind)
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


def _lines(text: str) -> list[str]:
    """Rule 1: the text's lines, once it is known to be within the limits."""
    if len(text) > MAX_BYTES or len(text.encode("utf-8", "surrogatepass")) > MAX_BYTES:
        raise fail("the base environment is larger than 1 MiB")
    for bad, what in (("\0", "a NUL character"), (r"[\ud800-\udfff]", "a lone surrogate")):
        found = re.search(bad, text)
        if found is not None:
            line = text.count("\n", 0, found.start()) + 1
            raise fail(f"line {line}: {what}; an environment file is UTF-8 text")
    lines = text.splitlines()
    if len(lines) > MAX_LINES:
        raise fail(f"{len(lines)} lines; at most {MAX_LINES}")
    if max(map(len, lines), default=0) > MAX_LINE:
        number = next(n for n, line in enumerate(lines, 1) if len(line) > MAX_LINE)
        raise fail(f"line {number} is longer than {MAX_LINE} characters")
    return lines


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


# --- freeze / requirements (rule 3) ---


def _freeze(lines: list[str]) -> list[tuple[str, str]]:
    logical = _logical_lines(lines)
    count = sum(not line.startswith("-") for _, line in logical)
    if count > MAX_PACKAGES:
        raise fail(f"at most {MAX_PACKAGES} packages, got {count}")
    pairs = []
    for number, line in logical:
        if line.startswith("-"):
            _option(number, line)
            continue
        pairs.append(_pin(number, line))
    return pairs


def _logical_lines(lines: list[str]) -> list[tuple[int, str]]:
    """(first line number, text) with comments stripped and `\\` continuations joined:
    a continued line's parts are collected and joined once (never rebuilt a line at a
    time, which was quadratic), refused as soon as they pass `MAX_LINE`."""
    out: list[tuple[int, str]] = []
    parts: list[str] = []
    start = size = 0
    pending = False
    for number, raw in enumerate(lines, 1):
        line = raw.split(" #", 1)[0].strip() if not raw.lstrip().startswith("#") else ""
        if not pending:
            start, size, parts = number, 0, []
        pending = line.endswith("\\")
        part = line[:-1].strip() if pending else line
        size += len(part) + 1
        if size > MAX_LINE:
            raise fail(
                f"line {start} is longer than {MAX_LINE} characters with its `\\` continuations"
            )
        if part:
            parts.append(part)
        if not pending and parts:
            out.append((start, " ".join(parts)))
    if pending and parts:
        out.append((start, " ".join(parts)))
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
    if len(text) > MAX_PIN:
        raise fail(
            f"line {number}: {_short(text)} is longer than {MAX_PIN} characters without its "
            "hashes; a pin is name==version"
        )
    if DIRECT.match(text) or " @ " in text or text.split("@", 1)[0] != text:
        raise fail(
            f"line {number}: {_short(text)} is a direct reference (URL, VCS or local path), "
            "which is never built from a job; pin it to a version on an index"
        )
    exact = EXACT.fullmatch(text)
    if exact is not None:
        return exact[1], _version(exact[2] or exact[3], exact[1])
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


# --- TOML locks (rules 4 to 6) ---

# The array of tables each lock lists its packages in.
ENTRIES = {UV_LOCK: "package", PYLOCK: "packages"}
TOML_TYPES: dict[type, str] = {
    str: "a string",
    bool: "a boolean",
    int: "an integer",
    float: "a float",
    list: "an array",
    dict: "a table",
    datetime: "a date-time",
    date: "a date",
    time: "a time",
}


def _lock(text: str, kind: str) -> list[tuple[str, str]]:
    _check_nesting(text, kind)
    lock = _Lock(kind, text)
    read = _uv_entry if kind == UV_LOCK else _pylock_entry
    pairs = []
    for index, entry in enumerate(lock.entries(_toml(text, kind)), 1):
        pair = read(lock, index, entry)
        if pair is not None:
            pairs.append(pair)
    return pairs


def _uv_entry(lock: "_Lock", index: int, entry: dict[str, Any]) -> tuple[str, str] | None:
    source = lock.get(index, entry, "source", dict)
    if source is None or "registry" not in source:
        return None  # the root project (virtual/editable), git, path, URL
    lock.get(index, source, "registry", str, label="source.registry", line_of="source")
    return lock.pin(index, entry)


def _pylock_entry(lock: "_Lock", index: int, entry: dict[str, Any]) -> tuple[str, str] | None:
    version = lock.get(index, entry, "version", str)
    if version is None or any(key in entry for key in ("vcs", "directory", "archive")):
        return None
    return lock.pin(index, entry)


# Where the nesting scan stops: a string's start (skipped whole by its pattern), a comment,
# a bracket, a dot, a line's end. A dotted key is a run of bare key characters, spaces,
# strings and dots; anything else ends it (the `=`, a bracket, a line's end).
_MARK = re.compile(r"\"\"\"|'''|[\"'#\[\]{}.\n]")
_STRING_END = {
    '"': re.compile(r'(?:[^"\\\n]|\\.)*"'),
    "'": re.compile(r"[^'\n]*'"),
    '"""': re.compile(r'(?:[^"\\]|\\[\s\S]|"(?!""))*""""{0,2}'),
    "'''": re.compile(r"[\s\S]*?''''{0,2}"),
}
_KEY_GAP = re.compile(r"[A-Za-z0-9_\- \t]*")


def _check_nesting(text: str, kind: str) -> None:
    """Rule 4's `MAX_DEPTH`, in one pass: brackets opened outside strings and comments,
    and the dots of one dotted key (`[a.b.c]`, `a.b.c = 1`)."""
    depth = dots = pos = last = 0  # `last`: where the dotted key's last part ended

    def deep(at: int) -> InvalidInput:
        line = text.count("\n", 0, at) + 1
        return fail(
            f"{kind} line {line}: nested more than {MAX_DEPTH} levels deep (arrays, inline "
            "tables or dotted keys)"
        )

    while (mark := _MARK.search(text, pos)) is not None:
        token, at, pos = mark.group(), mark.start(), mark.end()
        if token in _STRING_END:
            end = _STRING_END[token].match(text, pos)
            dots = dots if _KEY_GAP.fullmatch(text, last, at) else 0
            pos = last = end.end() if end else _line_end(text, pos)  # unterminated: tomllib says
        elif token == ".":
            dots = dots + 1 if _KEY_GAP.fullmatch(text, last, at) else 1
            last = pos
            if dots >= MAX_DEPTH:
                raise deep(at)
        else:
            if token == "#":
                pos = _line_end(text, pos)
            elif token in "[{":
                depth += 1
                if depth > MAX_DEPTH:
                    raise deep(at)
            elif token in "]}":
                depth = max(depth - 1, 0)
            dots, last = 0, pos


def _line_end(text: str, pos: int) -> int:
    end = text.find("\n", pos)
    return len(text) if end < 0 else end


def _toml(text: str, kind: str) -> dict[str, Any]:
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise fail(f"not a valid {kind}: {str(exc).splitlines()[0]}") from None
    except RecursionError:  # a nesting the scan did not see: refused the same way
        raise fail(f"not a valid {kind}: nested more than {MAX_DEPTH} levels deep") from None


def _a(value: Any) -> str:
    return TOML_TYPES.get(type(value), type(value).__name__)


class _Lock:
    """A TOML lock's entries, each field read with its type checked (rule 4); a wrong one
    is refused naming the field and the line that sets it (else its entry's, else none)."""

    def __init__(self, kind: str, text: str) -> None:
        self.kind, self.text, self.key = kind, text, ENTRIES[kind]

    def entries(self, data: dict[str, Any]) -> list[dict[str, Any]]:
        value = data.get(self.key, [])
        if not isinstance(value, list):
            raise self._error(f"{self.key} must be an array of tables, not {_a(value)}")
        for index, entry in enumerate(value, 1):
            if not isinstance(entry, dict):
                message = f"{self.key} entry {index} must be a table, not {_a(entry)}"
                raise self._error(message, index)
        return value

    def get(
        self,
        index: int,
        table: dict[str, Any],
        field: str,
        kind: type,
        *,
        label: str | None = None,
        line_of: str | None = None,
    ) -> Any:
        """`table[field]` (None when absent), refused unless it is a `kind`."""
        value = table.get(field)
        if value is None or isinstance(value, kind):
            return value
        message = f"{self.key} entry {index}: {label or field} must be {TOML_TYPES[kind]}"
        raise self._error(f"{message}, not {_a(value)}", index, line_of or field)

    def pin(self, index: int, entry: dict[str, Any]) -> tuple[str, str]:
        name, version = (self.get(index, entry, field, str) for field in ("name", "version"))
        for field, value in (("name", name), ("version", version)):
            if value is None:
                raise self._error(f"{self.key} entry {index} has no {field}", index)
        if not re.fullmatch(NAME, name):
            raise fail(f"{_short(name)} in the {self.kind} is not a package name")
        return name, _version(version, name)

    def _error(
        self, message: str, index: int | None = None, field: str | None = None
    ) -> InvalidInput:
        at = self._where(index, field)
        line = "" if at is None else f" line {self.text.count(chr(10), 0, at) + 1}"
        return fail(f"{self.kind}{line}: {message}")

    def _where(self, index: int | None, field: str | None) -> int | None:
        """Where `field` of entry `index` is set: searched in the entry's `[[key]]` section,
        else that section's header, else the first line that sets `key` (an inline array)."""
        key = _key(self.key)
        headers = [
            m.start() for m in re.finditer(rf"^[ \t]*\[\[[ \t]*{key}[ \t]*\]\]", self.text, re.M)
        ]
        if index is None or index > len(headers):
            found = re.search(rf"^[ \t]*\[*[ \t]*{key}[ \t]*[=.\]]", self.text, re.M)
            return None if found is None else found.start()
        start = headers[index - 1]
        end = headers[index] if index < len(headers) else len(self.text)
        if field is not None:
            found = re.compile(rf"^[ \t]*{_key(field)}[ \t]*[=.]", re.M).search(
                self.text, start, end
            )
            if found is not None:
                return found.start()
        return start


def _key(name: str) -> str:
    """A pattern for TOML key `name`, bare or quoted."""
    quoted = re.escape(name)
    return f"(?:{quoted}|\"{quoted}\"|'{quoted}')"


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
