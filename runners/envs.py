"""Candidate environments, built with uv.

One virtual environment per candidate, under ``root/<spec-hash>``, where the
hash covers everything in the `EnvSpec`. A finished environment carries a
marker file (``.leakbisect-env.json``) with what the build recorded; an
environment without one was interrupted half-way and is rebuilt. All builds
share one uv cache, and uv hard-links from it when the cache and the
environments are on the same filesystem, so a warm build takes about a second.

Transitive drift (see DESIGN.md, Environments): by default the other packages
are held at the good bound's pins (`resolve_pins`), passed to uv as
constraints; when those cannot be resolved the build falls back to free
resolution and says why. "As released" builds pass ``--exclude-newer``. A base
environment (`EnvSpec.base_env`, from `--base-env`) installs every pinned package,
not only what the candidate needs, and leaves only the pins uv's error names
(`_Build.install_base`), noting each version that changed.

A strict mix (`EnvSpec.strict`, with `base_env`; delta debugging between two
environments) installs every pin exactly, in one ``uv pip install`` with every
name (``-r``) held at its pin (``-c``), and never loosens one: when uv finds no
solution the build is ``ok=False, unresolvable=True`` with uv's reason on one
line (the mix is invalid, a skip), any other failure ``ok=False`` as usual; a
mix that builds has resolution ``"strict"``.

A source build (`EnvSpec.source`, ``git+URL@REV``) installs
``package @ git+URL@REV`` instead of ``package==version``, everything else as
usual: uv clones (into its cache) and builds the commit, with ``git`` as the
build user. A local clone (``git+file:///clone@REV``) must be readable by the
build user (an `EnvError` names what blocks), and is trusted by git although
another user owns it (`_trust_clone`). A commit that does not build is
``ok=False`` with uv's message (a skip for the caller).

`build_env` raises `EnvError` for a spec that is wrong in itself (a
requirement that does not parse, a Python that is not installed); a candidate
that uv cannot install is an `EnvResult` with ``ok=False`` and uv's message.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

from runners.errors import Unavailable
from runners.sandbox import give, private_dir, shared_dir, uv_cache_dir
from runners.users import Identities, blocked_by, identities
from runners.uvrun import (
    ERROR_LINES,
    NO_SOLUTION,
    QUICK_TIMEOUT_S,
    EnvError,
    blocked_for_all,
    find_python,
    meaningful,
    one_line_reason,
    run_uv,
    running_python,
    uv_bin,
    uv_env,
)
from runners.wire import EnvResult, EnvSpec

try:  # POSIX; on other systems concurrent builds of one spec are not serialized.
    import fcntl
except ImportError:  # pragma: no cover
    fcntl = None  # type: ignore[assignment]

__all__ = [
    "ERROR_LINES",
    "EnvError",
    "build_env",
    "default_cache_dir",
    "exclude_newer_arg",
    "find_python",
    "freeze_diff",
    "index_args",
    "prepare_dirs",
    "resolve_pins",
    "spec_hash",
]

MARKER = ".leakbisect-env.json"
CONSTRAINTS_FILE = "leakbisect-constraints.txt"
BASE_FILE = "leakbisect-base-env.txt"
# A base environment's pins a candidate may leave, one uv error at a time, before the
# build gives up holding them.
MAX_FORCED_ROUNDS = 20
# A cold install of a large stack (torch and friends) can take many minutes.
INSTALL_TIMEOUT_S = 3600.0

Log = Callable[[str], None]

# ---------------------------------------------------------------------------
# pure helpers


def spec_hash(spec: EnvSpec) -> str:
    """The name of a spec's environment directory: a hash of the whole spec.

    Canonical JSON with sorted keys; requirement and constraint lists are
    sorted (their order means nothing), index URLs keep their order (it
    decides which index wins). A spec without a Python is hashed with the
    running interpreter's version, which is what it gets built with.
    """
    data = spec.model_dump(mode="json")
    data["requirements"] = sorted(spec.requirements)
    data["constraints"] = sorted(spec.constraints)
    if spec.exclude_newer is not None:
        data["exclude_newer"] = _iso(spec.exclude_newer)
    if spec.python is None:
        data["python"] = running_python()
    # Environments built before these fields existed keep their names.
    if not spec.base_env:
        del data["base_env"]
    if not spec.strict:
        del data["strict"]
    if spec.source is None:
        del data["source"]
    blob = json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def freeze_diff(a: list[str], b: list[str]) -> list[tuple[str, str | None, str | None]]:
    """Packages whose versions differ between two freezes, sorted by name.

    Each row is ``(name, version in a, version in b)``; ``None`` where the
    package is absent. A direct reference (``name @ url``) counts the URL as
    its version.
    """
    pa, pb = _parse_freeze(a), _parse_freeze(b)
    rows = []
    for key in sorted(pa.keys() | pb.keys()):
        name_a, va = pa.get(key, (None, None))
        name_b, vb = pb.get(key, (None, None))
        if va != vb:
            rows.append((name_a or name_b or key, va, vb))
    return rows


def _parse_freeze(lines: list[str]) -> dict[str, tuple[str, str]]:
    out: dict[str, tuple[str, str]] = {}
    for raw in lines:
        line = raw.split(" #", 1)[0].strip()
        if not line or line.startswith(("#", "-")):
            continue
        if "==" in line:
            name, _, version = line.partition("==")
        elif " @ " in line:
            name, _, version = line.partition(" @ ")
        else:
            continue
        name = name.split("[", 1)[0].strip()
        out[canonicalize_name(name)] = (name, version.split(";", 1)[0].strip())
    return out


def _utc(when: datetime) -> datetime:
    """Naive means UTC."""
    return (when if when.tzinfo is not None else when.replace(tzinfo=UTC)).astimezone(UTC)


def _iso(when: datetime) -> str:
    return _utc(when).isoformat().replace("+00:00", "Z")


def exclude_newer_arg(when: datetime) -> str:
    """The ``--exclude-newer`` value that admits everything uploaded at or before `when`.

    uv keeps a file only when its upload time is strictly before the cutoff, in whole
    milliseconds, so the candidate's own upload time as cutoff would exclude the
    candidate. `EnvSpec.exclude_newer` means "nothing uploaded *after* this instant",
    hence the cutoff is `when`'s millisecond plus one.
    """
    cutoff = _utc(when).replace(microsecond=_utc(when).microsecond // 1000 * 1000)
    cutoff += timedelta(milliseconds=1)
    return cutoff.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _pinned(text: str) -> tuple[str, str]:
    """``Name==1.0`` -> ("name", "1.0")."""
    name, _, version = text.partition("==")
    return canonicalize_name(name.split("[", 1)[0].strip()), version.strip()


# A requirement in uv's resolver error: "jax==0.4.30", "jax>=0.5", "jax<0.5,>=0.4".
_MENTION = re.compile(
    r"(?<![\w.-])([A-Za-z0-9][A-Za-z0-9._-]*)(?:\[[^\]]*\])?(?:==|>=|<=|!=|~=|<|>)"
)


def _named_packages(stderr: str) -> list[str]:
    """The packages uv's error names with a version, normalised, in order of mention."""
    names: list[str] = []
    for match in _MENTION.finditer(stderr):
        name = canonicalize_name(match.group(1))
        if name not in names:
            names.append(name)
    return names


def _parse_requirement(text: str, what: str = "requirement") -> Requirement:
    try:
        return Requirement(text)
    except InvalidRequirement as exc:
        reason = str(exc).splitlines()[0] if str(exc) else "invalid"
        raise EnvError(f"{what} {text!r} does not parse: {reason}") from None


def _source_parts(source: str) -> tuple[str, str]:
    """``git+URL@REV`` -> (URL, REV); `EnvError` for anything else.

    The revision's ``@`` is the last one after the URL's host (``git+ssh://git@host/x@rev``
    has one in the host part too).
    """
    bad = EnvError(f"source {source!r} is not a git+URL@REV reference", field="source")
    if not source.startswith("git+") or "://" not in source or any(c.isspace() for c in source):
        raise bad
    scheme, _, rest = source[len("git+") :].partition("://")
    host, slash, path = rest.partition("/")
    url, at, rev = path.rpartition("@")
    if not scheme or not slash or not at or not url.strip("/") or not rev:
        raise bad
    return f"{scheme}://{host}/{url}", rev


def _validate(spec: EnvSpec) -> tuple[str, list[str]]:
    """Check a spec; return the candidate's requirement and the constraints to pass on."""
    if not spec.package or not re.fullmatch(
        r"[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?", spec.package
    ):
        raise EnvError(f"package {spec.package!r} is not a valid project name")
    if spec.strict and not spec.base_env:
        raise EnvError("strict holds a base environment's pins: it needs base_env", field="strict")
    pin = f"{spec.package}=={spec.version}"
    _parse_requirement(pin)
    if spec.source is not None:
        _source_parts(spec.source)
        pin = f"{spec.package} @ {spec.source}"
        _parse_requirement(pin, "source")
    for req in spec.requirements:
        _parse_requirement(req)
    own = canonicalize_name(spec.package)
    constraints = []
    for text in spec.constraints:
        if canonicalize_name(_parse_requirement(text, "constraint").name) != own:
            constraints.append(text)
    return pin, constraints


# ---------------------------------------------------------------------------
# directories and index options


def default_cache_dir() -> Path:
    """The uv cache the builds share (`runners.sandbox.uv_cache_dir`): ``$UV_CACHE_DIR``
    when set, else ``<cache home>/uv`` (``$XDG_CACHE_HOME/leakbisect/uv``, for root
    ``/var/cache/leakbisect/uv``, else ``~/.cache/leakbisect/uv``)."""
    return uv_cache_dir()


def prepare_dirs(root: Path, cache_dir: Path | None = None) -> tuple[Path, Path]:
    """Make the environment root and the uv cache usable: owned by the build user, 0755.

    Also checks that the build user can run uv. Raises `runners.errors.Unavailable` with
    one line naming the path that blocks and the fix (a runner calls this at start).
    """
    ids = identities()
    readers = [ids.trial] if ids.trial is not None else []
    root = shared_dir(Path(root), ids.build, readers, "environment root")
    cache = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    cache = shared_dir(cache, ids.build, readers, "uv cache")
    uv = uv_bin()
    reason = blocked_by(Path(uv), ids.build, "x")
    if reason is not None:
        raise Unavailable(
            f"uv {uv} cannot be run by {ids.build}: {reason}; install uv where every user "
            "can reach it (e.g. pip install uv into a venv outside /root)"
        )
    return root, cache


def _is_url(link: str) -> bool:
    return "://" in link and not link.startswith("file://")


def _check_find_links(spec: EnvSpec, ids: Identities) -> None:
    """A local ``find_links`` directory must be readable by the build user."""
    for link in spec.find_links:
        if _is_url(link):
            continue
        path = Path(link.removeprefix("file://"))
        reason = blocked_by(path, ids.build, "rx")
        if reason is not None:
            raise EnvError(
                f"find_links {link} is not readable by {ids.build}: {reason}; "
                "put the wheels in a directory every user can read",
                field="find_links",
            )


def _local_clone(spec: EnvSpec) -> Path | None:
    """The clone a ``git+file://`` source builds from; None for any other spec."""
    if spec.source is None or not spec.source.startswith("git+file://"):
        return None
    url, _ = _source_parts(spec.source)
    return Path(url.removeprefix("file://"))


def _check_source(spec: EnvSpec, ids: Identities) -> None:
    """A local clone (``git+file://``) must be readable by the build user, who runs git."""
    path = _local_clone(spec)
    if path is None:
        return
    reason = blocked_by(path, ids.build, "rx")
    if reason is None and path.exists() and not path.is_dir():
        reason = f"{path} is not a directory"
    if reason is not None:
        raise EnvError(
            f"source {spec.source} is not readable by {ids.build or 'the runner'}: {reason}; "
            "put the clone in a directory every user can read",
            field="source",
        )


def _trust_clone(spec: EnvSpec, home: Path, ids: Identities) -> None:
    """Let git, as the build user, read a local clone another user owns.

    uv runs ``git fetch`` from the clone as the build user, and git refuses a repository
    another user owns ("dubious ownership"). That check guards against a repository's own
    config running code as whoever reads it; here the build user runs the clone's build
    backend anyway, so trusting that one path gives it nothing new. The setting goes in the
    build's private HOME (``.gitconfig``): git drops command-line config
    (``GIT_CONFIG_COUNT``) from the upload-pack it starts for a local fetch.
    """
    path = _local_clone(spec)
    if path is None:
        return
    clone = os.path.realpath(path)
    paths = [clone, os.path.join(clone, ".git")]
    # git config quoting: backslash and double quote escaped (whitespace is refused earlier).
    quoted = ['"' + p.replace("\\", "\\\\").replace('"', '\\"') + '"' for p in paths]
    text = "[safe]\n" + "".join(f"\tdirectory = {q}\n" for q in quoted)
    give(home / ".gitconfig", ids.build, 0o644, text)


def index_args(spec: EnvSpec) -> list[str]:
    """uv's index, find-links, pre-release and exclude-newer flags for `spec`."""
    args: list[str] = []
    if spec.index_url:
        args += ["--index-url", spec.index_url]
    for url in spec.extra_index_urls:
        args += ["--extra-index-url", url]
    for link in spec.find_links:
        args += ["--find-links", link]
    if spec.pre:
        args += ["--prerelease", "allow"]
    if spec.exclude_newer is not None:
        args += ["--exclude-newer", exclude_newer_arg(spec.exclude_newer)]
    return args


def resolve_pins(spec: EnvSpec, *, cache_dir: Path | None = None) -> list[str]:
    """``name==version`` for every package ``PKG==VER`` + requirements resolve to.

    ``uv pip compile`` for the spec's Python version (``--python-version``),
    with the spec's index options, as any build: the build user, the allowlisted
    environment, a private directory. The spec's own constraints are not applied
    (these pins are what later specs get as constraints). `cache_dir` as for
    `build_env`. Raises `EnvError` with uv's one-line reason when it cannot
    resolve.
    """
    pin, _ = _validate(spec)
    python = spec.python or running_python()
    ids = identities()
    cache = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    shared_dir(cache, ids.build, [], "uv cache")
    _check_find_links(spec, ids)
    _check_source(spec, ids)
    with private_dir(ids.build, "leakbisect-pins-") as tmp:
        _trust_clone(spec, tmp, ids)
        reqs = give(tmp / "requirements.in", ids.build, 0o644, "\n".join([pin, *spec.requirements]))
        cmd = [
            uv_bin(), "pip", "compile", str(reqs),
            "--python-version", python,
            "--no-header", "--no-annotate", "--no-strip-markers",
            *index_args(spec),
        ]  # fmt: skip
        proc = run_uv(cmd, uv_env(cache, home=tmp), None, cwd=tmp, ids=ids)
    if proc.returncode != 0:
        raise EnvError(f"cannot resolve {pin}: {one_line_reason(proc.stderr)}")
    pins = []
    for line in proc.stdout.splitlines():
        text = line.split(" #", 1)[0].strip()
        if text and not text.startswith(("#", "-")):
            pins.append(text.split(" \\", 1)[0].strip())
    return pins


# ---------------------------------------------------------------------------
# building


def _venv_python(venv: Path) -> Path:
    if os.name == "nt":  # pragma: no cover
        return venv / "Scripts" / "python.exe"
    return venv / "bin" / "python"


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """Serialize builds of one spec across threads and processes on this host."""
    with open(path, "a+") as fh:
        if fcntl is not None:
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            if fcntl is not None:
                fcntl.flock(fh.fileno(), fcntl.LOCK_UN)


def _remove(path: Path) -> None:
    if path.is_symlink() or path.is_file():
        path.unlink()
    elif path.exists():
        shutil.rmtree(path)


@dataclass
class _Build:
    """One build of one spec's environment: the venv, uv's environment, the users."""

    spec: EnvSpec
    root: Path
    cache: Path
    env: dict[str, str]
    ids: Identities
    log: Log | None
    started: float = field(default_factory=time.monotonic)

    @property
    def venv(self) -> Path:
        return self.root / spec_hash(self.spec)

    @property
    def python(self) -> Path:
        return _venv_python(self.venv)

    def result(self, **kw: Any) -> EnvResult:
        return EnvResult(seconds=round(time.monotonic() - self.started, 3), **kw)

    def uv(self, *args: str, timeout: float = QUICK_TIMEOUT_S) -> subprocess.CompletedProcess[str]:
        return run_uv([uv_bin(), *args], self.env, self.log, timeout=timeout, cwd=self.root,
                      ids=self.ids)  # fmt: skip

    def freeze(self) -> list[str] | None:
        proc = self.uv("pip", "freeze", "--python", str(self.python))
        if proc.returncode != 0:
            return None
        return [ln.strip() for ln in proc.stdout.splitlines() if ln.strip()]

    def say(self, line: str) -> None:
        if self.log:
            self.log(line)

    # -- reuse

    def reused(self) -> EnvResult | None:
        """The recorded build when the environment is complete, unchanged and runnable."""
        record = self._record() if (self.venv / MARKER).exists() else None
        if record is None:
            return None
        self.say(f"reusing {self.venv}")
        return self.result(
            ok=True,
            path=str(self.venv),
            python_executable=str(self.python),
            freeze=record["freeze"],
            resolution=record.get("resolution", "free"),
            resolution_note=record.get("resolution_note"),
            reused=True,
        )

    def _record(self) -> dict | None:
        try:
            record = json.loads((self.venv / MARKER).read_text())
        except (OSError, ValueError):
            return None
        if not self.python.exists():
            return None
        blocked = blocked_for_all(os.path.realpath(self.python), self.ids)
        if blocked is not None:
            self.say(f"{self.venv.name}: its interpreter cannot be run by {blocked}; rebuilding")
            return None
        freeze = self.freeze()
        if freeze is None or freeze != record.get("freeze"):
            self.say(
                f"{self.venv.name}: installed packages differ from the recorded build; rebuilding"
            )
            return None
        return record

    # -- building

    def build(self, pin: str, constraints: list[str]) -> EnvResult:
        venv = self.venv
        if venv.exists() or venv.is_symlink():
            self.say(f"removing incomplete environment {venv}")
            _remove(venv)
        base = find_python(self.spec.python, cache_dir=self.cache)
        proc = self.uv("venv", "--no-project", "--python", base, str(venv))
        if proc.returncode != 0:
            _remove(venv)
            return self.result(ok=False, error=meaningful(proc.stderr) or "uv venv failed")
        proc, resolution, note = self.install(pin, constraints)
        if proc.returncode != 0 and resolution == "strict" and NO_SOLUTION in proc.stderr:
            _remove(venv)  # an invalid mix: a skip for the caller, not the candidate's fault
            reason = one_line_reason(proc.stderr)
            return self.result(ok=False, error=reason, resolution=resolution, unresolvable=True)
        if proc.returncode != 0:
            _remove(venv)
            message = meaningful(proc.stderr) or f"uv pip install exited with {proc.returncode}"
            return self.result(ok=False, error=message, resolution=resolution, resolution_note=note)
        freeze = self.freeze()
        if freeze is None:
            _remove(venv)
            return self.result(ok=False, error="uv pip freeze failed on the new environment")
        self.write_record(base, freeze, resolution, note)
        return self.result(
            ok=True,
            path=str(venv),
            python_executable=str(self.python),
            freeze=freeze,
            resolution=resolution,
            resolution_note=note,
        )

    def install(
        self, pin: str, constraints: list[str]
    ) -> tuple[subprocess.CompletedProcess[str], str, str | None]:
        """``uv pip install``, held at the constraints when there are any (falling back to
        free resolution, with a note, when they do not resolve)."""
        spec = self.spec
        args = ["pip", "install", "--python", str(self.python), pin, *spec.requirements,
                *index_args(spec)]  # fmt: skip
        released = spec.exclude_newer is not None
        resolution = "as-released" if released else "free"
        if spec.strict:
            return self.install_strict(args, constraints)
        if spec.base_env:
            return self.install_base(args, constraints)
        if not spec.constraints:
            return self.uv(*args, timeout=INSTALL_TIMEOUT_S), resolution, None
        cfile = self.venv / CONSTRAINTS_FILE
        cfile.write_text("".join(f"{c}\n" for c in constraints))
        proc = self.uv(*args, "-c", str(cfile), timeout=INSTALL_TIMEOUT_S)
        if proc.returncode == 0:
            return proc, ("as-released" if released else "constrained"), None
        if NO_SOLUTION not in proc.stderr:
            return proc, resolution, None
        note = f"held pins did not resolve, resolved freely: {one_line_reason(proc.stderr)}"
        self.say(note)
        return self.uv(*args, timeout=INSTALL_TIMEOUT_S), resolution, note

    def names_file(self, held: dict[str, str]) -> Path:
        """The base environment's names, one a line, for ``-r``: every package is installed."""
        # A file: a base environment has thousands of packages.
        names = self.venv / BASE_FILE
        names.write_text("".join(f"{n}\n" for n in held))
        return names

    def install_strict(
        self, args: list[str], constraints: list[str]
    ) -> tuple[subprocess.CompletedProcess[str], str, str | None]:
        """A mix (`EnvSpec.strict`): every pin installed exactly, once; nothing is loosened.

        The caller (`build`) turns uv's "no solution" into ``unresolvable``.
        """
        held = dict(_pinned(c) for c in constraints)
        cfile = self.venv / CONSTRAINTS_FILE
        cfile.write_text("".join(f"{n}=={v}\n" for n, v in held.items()))
        args = [*args, "-r", str(self.names_file(held)), "-c", str(cfile)]
        return self.uv(*args, timeout=INSTALL_TIMEOUT_S), "strict", None

    def install_base(
        self, args: list[str], constraints: list[str]
    ) -> tuple[subprocess.CompletedProcess[str], str, str | None]:
        """The user's whole environment with the candidate swapped in (`--base-env`).

        Every package of the base environment is installed, held at its pin. Where the
        candidate (or a --with requirement) cannot have a pin, uv's error names it: that
        pin is left, the package stays in (resolved to what fits), and the note says
        what changed. An error that names no held pin falls back to free resolution.
        """
        held = dict(_pinned(c) for c in constraints)
        args = [*args, "-r", str(self.names_file(held))]
        cfile = self.venv / CONSTRAINTS_FILE
        left: dict[str, str] = {}
        reason = ""
        for _ in range(MAX_FORCED_ROUNDS):
            cfile.write_text("".join(f"{n}=={v}\n" for n, v in held.items()))
            proc = self.uv(*args, "-c", str(cfile), timeout=INSTALL_TIMEOUT_S)
            if proc.returncode == 0:
                return proc, "constrained", self.forced_note(left, reason)
            named = [n for n in _named_packages(proc.stderr) if n in held]
            if NO_SOLUTION not in proc.stderr or not named:
                break
            reason = reason or one_line_reason(proc.stderr)
            for name in named:
                left[name] = held.pop(name)
            self.say(f"base env: leaving {', '.join(named)} to the resolver: {reason}")
        if NO_SOLUTION not in proc.stderr:
            return proc, "free", None
        note = f"base env did not resolve, resolved freely: {one_line_reason(proc.stderr)}"
        self.say(note)
        return self.uv(*args, timeout=INSTALL_TIMEOUT_S), "free", note

    def forced_note(self, left: dict[str, str], reason: str) -> str | None:
        """The note "base env, except jax 0.4.30 -> 0.5.0 (uv: ...)", from the freeze."""
        if not left:
            return None
        now = dict(_pinned(line) for line in self.freeze() or [] if "==" in line)
        changes = [f"{name} {old} -> {now.get(name, 'absent')}" for name, old in left.items()]
        return f"base env, except {', '.join(changes)} (uv: {reason})"

    def write_record(self, base: str, freeze: list[str], resolution: str, note: str | None) -> None:
        record = {
            "hash": self.venv.name,
            "spec": self.spec.model_dump(mode="json"),
            "python": base,
            "freeze": freeze,
            "resolution": resolution,
            "resolution_note": note,
            "built_at": datetime.now(UTC).isoformat(),
            "build_seconds": round(time.monotonic() - self.started, 3),
        }
        tmp = self.venv / f"{MARKER}.tmp"
        tmp.write_text(json.dumps(record, indent=1))
        os.replace(tmp, self.venv / MARKER)
        self.say(f"built {self.venv} ({resolution}) in {record['build_seconds']} s")


def build_env(
    spec: EnvSpec,
    *,
    root: Path,
    cache_dir: Path | None = None,
    log: Log | None = None,
) -> EnvResult:
    """Build (or reuse) the environment for one candidate under ``root/<spec-hash>``.

    Every uv command runs as the build user (`runners.uvrun`). Raises `EnvError` for a
    spec that is wrong in itself; returns ``ok=False`` with uv's message when the
    candidate cannot be installed.
    """
    started = time.monotonic()
    pin, constraints = _validate(spec)
    root, cache = prepare_dirs(root, cache_dir)
    ids = identities()
    _check_find_links(spec, ids)
    _check_source(spec, ids)
    key = spec_hash(spec)
    with _locked(root / f"{key}.lock"), private_dir(ids.build, "leakbisect-build-") as home:
        env = uv_env(cache, link_from=root, home=home)
        _trust_clone(spec, home, ids)
        build = _Build(spec, root, cache, env, ids, log, started)
        return build.reused() or build.build(pin, constraints)
