"""Candidate environments, built with uv.

One virtual environment per owner and candidate, under
``root/<owner key>/<spec-hash>``, where the hash covers everything in the
`EnvSpec` and the owner key is a hash of the job's owner (`runners.publish`).
A build happens in a private staging directory as the build user and is then
published: taken over by the runner (root's and read-only when the runner is
root), given its record (``.leakbisect-env.json``: what the build recorded,
with a content digest and a stat fingerprint of every file) and renamed into
place. Reuse needs that record, written by the runner, and the fingerprint to
match (the files are what was published); otherwise the environment is rebuilt
with one log line saying why. Each owner's builds share that owner's uv cache
(``<cache>/<owner key>/uv``; `bisect-cli run`, as a user, the cache itself).
As a user, uv hard-links from it when the cache and the environments are on the
same filesystem, so a warm build takes about a second; as root it copies (a
published file must not be the inode of a file the build user can write), and
builds run one at a time (one build uid; see `runners.publish`). The
constraint and name files uv reads are written by the runner into a directory
of its own, then kept beside the published environment.

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
import logging
import os
import re
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

from contract import outbound
from contract.envargs import index_args, utc
from contract.errors import Unavailable
from contract.paths import uv_cache_dir
from contract.wire import Cause, EnvResult, EnvSpec, Failure, clip
from runners import publish, safefs
from runners.egress import Egress, egress
from runners.publish import PublishError, create_file, owner_key, replace_file
from runners.sandbox import give, private_dir
from runners.users import Identities, blocked_by, identities
from runners.uvrun import (
    ERROR_LINES,
    NO_SOLUTION,
    QUICK_TIMEOUT_S,
    EnvError,
    blocked_for_all,
    classify,
    find_python,
    meaningful,
    one_line_reason,
    run_uv,
    running_python,
    uv_bin,
    uv_env,
)

__all__ = [
    "ERROR_LINES",
    "EnvError",
    "build_env",
    "default_cache_dir",
    "find_python",
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
# A staging directory this old belongs to a build that died with its runner (a build's
# uv commands are each bounded by INSTALL_TIMEOUT_S; a base environment runs a few).
STALE_STAGING_S = 6 * INSTALL_TIMEOUT_S

Log = Callable[[str], None]
log = logging.getLogger(__name__)

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
    del data["reach"]  # where the URLs may lead decides nothing the environment holds
    blob = json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def _iso(when: datetime) -> str:
    return utc(when).isoformat().replace("+00:00", "Z")


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
    """The uv cache the builds share (`contract.paths.uv_cache_dir`): ``$UV_CACHE_DIR``
    when set, else ``<cache home>/uv`` (``$XDG_CACHE_HOME/leakbisect/uv``, for root
    ``/var/cache/leakbisect/uv``, else ``~/.cache/leakbisect/uv``)."""
    return uv_cache_dir()


def prepare_dirs(root: Path, cache_dir: Path | None = None) -> tuple[Path, Path]:
    """Make the environment root and the uv cache root usable: the runner's own.

    As root both are owned by root (0755; the cache 0711): the build user writes only a
    staging directory and its owner's cache below them (`runners.publish`). One an older
    runner left owned by the build user is taken over (its top only: the environments
    and the cache in it are never reused); one owned by any other user is refused. Also
    checks that the build user can run uv. Raises `contract.errors.Unavailable` with one
    line naming the path that blocks and the fix (a runner calls this at start).
    """
    ids = identities()
    readers = [ids.trial] if ids.trial is not None else []
    root = publish.runner_dir(Path(root), readers, "environment root", ids.build)
    publish.clear_stale(root, STALE_STAGING_S)
    cache = _usable_cache(root, cache_dir, ids)
    uv = uv_bin()
    reason = blocked_by(Path(uv), ids.build, "x")
    if reason is not None:
        raise Unavailable(
            f"uv {uv} cannot be run by {ids.build}: {reason}; install uv where every user "
            "can reach it (e.g. pip install uv into a venv outside /root)"
        )
    return root, cache


# The inherited UV_CACHE_DIRs already replaced (and said so) in this process.
_REPLACED: set[Path] = set()


def _usable_cache(root: Path, cache_dir: Path | None, ids: Identities) -> Path:
    """The uv cache root. As root, an inherited ``UV_CACHE_DIR`` the build user cannot use
    (root's own, under /root: what a CI container's uv setup step leaves) is replaced by
    leakbisect's own cache beside the environment root, and a warning says so once per
    process, in one line, instead of every run failing. A cache the runner was given any
    other way that the build user cannot use is still refused (`Unavailable`)."""
    try:
        return _cache_root(cache_dir, ids)
    except Unavailable:
        inherited = os.environ.get("UV_CACHE_DIR")
        if ids.build is None or cache_dir is None or not inherited:
            raise
        if Path(inherited) != Path(cache_dir):
            raise
        own = root.parent / "uv"
        if Path(cache_dir) not in _REPLACED:
            _REPLACED.add(Path(cache_dir))
            log.warning(
                "UV_CACHE_DIR %s is not usable by the build user, %s; builds use "
                "leakbisect's own uv cache %s instead",
                cache_dir,
                ids.build,
                own,
            )
        return _cache_root(own, ids)


def _cache_root(cache_dir: Path | None, ids: Identities) -> Path:
    cache = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    builders = [ids.build] if ids.build is not None else []
    return publish.runner_dir(cache, builders, "uv cache", ids.build, 0o711)


@contextlib.contextmanager
def _inputs() -> Iterator[Path]:
    """A directory of the runner's that the build user can read, for the files uv reads
    (requirements, constraints, names): nobody else can plant a name or a link in it."""
    with private_dir(None, "leakbisect-inputs-") as inputs:
        inputs.chmod(0o755)
        yield inputs


@contextlib.contextmanager
def owner_cache(cache_root: Path, owner: str | None, ids: Identities) -> Iterator[Path]:
    """The uv cache one owner's builds use, for the time of one build.

    As root, builds run one at a time (the host's build lock, in the cache root) and
    only the building owner's cache is reachable by the build user (`publish.open_cache`).
    As a user, a run without an owner (`bisect-cli run`) uses the cache root itself (so
    a ``UV_CACHE_DIR`` shared with the user's own uv keeps cold builds warm).
    """
    if ids.build is None:
        if owner is None:
            yield cache_root
            return
        with publish.open_cache(cache_root, owner_key(owner), None) as cache:
            yield cache
        return
    locks = publish.child_dir(cache_root, publish.LOCKS, 0o700)
    with (
        publish.locked(locks, "builds.lock"),
        publish.open_cache(cache_root, owner_key(owner), ids.build) as cache,
    ):
        yield cache


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


def _check_reach(spec: EnvSpec) -> dict[str, str]:
    """Under the job's outbound rule (`EnvSpec.reach`, contract/outbound.py) every URL uv
    will reach passes it here, against the addresses its name resolves to, before uv
    starts (`EnvError` names the URL and the rule); a local find-links path or a
    ``git+file://`` source is refused. Returns the environment for the git uv runs for a
    source build: no redirects, the checked addresses pinned (`outbound.git_settings`)."""
    if spec.reach is None:
        return {}
    named = [("index_url", "index", spec.index_url)] if spec.index_url else []
    named += [("extra_index_urls", "index", url) for url in spec.extra_index_urls]
    named += [("find_links", "find-links", url) for url in spec.find_links]
    for name, what, url in named:
        try:
            outbound.check(url, spec.reach)
        except outbound.Refused as exc:
            raise EnvError(outbound.describe(what, url, exc), field=name) from None
    if spec.source is None:
        return {}
    url, _ = _source_parts(spec.source)
    try:
        allowed = outbound.check(url, spec.reach, outbound.GIT_SCHEMES)
    except outbound.Refused as exc:
        raise EnvError(outbound.describe("repository", url, exc), field="source") from None
    return outbound.git_env(outbound.git_settings(allowed))


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


def resolve_pins(
    spec: EnvSpec, *, cache_dir: Path | None = None, owner: str | None = None
) -> list[str]:
    """``name==version`` for every package ``PKG==VER`` + requirements resolve to.

    ``uv pip compile`` for the spec's Python version (``--python-version``),
    with the spec's index options, as any build: the build user, the allowlisted
    environment, a private directory. The spec's own constraints are not applied
    (these pins are what later specs get as constraints). `cache_dir` and `owner` as
    for `build_env` (resolving builds sdists for their metadata: the job's code).
    Raises `EnvError` with uv's one-line reason when it cannot resolve.
    """
    pin, _ = _validate(spec)
    python = spec.python or running_python()
    git = _check_reach(spec)
    ids = identities()
    _check_find_links(spec, ids)
    _check_source(spec, ids)
    cache_root = _cache_root(cache_dir, ids)
    with (
        owner_cache(cache_root, owner, ids) as cache,
        private_dir(ids.build, "leakbisect-pins-") as tmp,
        _inputs() as inputs,
        egress(spec.reach) as proxy,
    ):
        _trust_clone(spec, tmp, ids)
        create_file(inputs, "requirements.in", "\n".join([pin, *spec.requirements]).encode())
        cmd = [
            uv_bin(), "pip", "compile", str(inputs / "requirements.in"),
            "--python-version", python,
            "--no-header", "--no-annotate", "--no-strip-markers",
            *index_args(spec),
        ]  # fmt: skip
        routed = proxy.env() if proxy is not None else {}
        proc = run_uv(cmd, uv_env(cache, home=tmp) | git | routed, None, cwd=tmp, ids=ids)
    if proc.returncode != 0:
        reason = one_line_reason(proc.stderr)
        failure = classify(proc, proxy, ruled=spec.reach is not None)
        if failure is not None and failure.cause.infrastructure:
            log.warning("resolving %s: %s", pin, reason)  # uv's words stay on the runner
            reason = failure.message
        raise EnvError(f"cannot resolve {pin}: {reason}", failure=failure)
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


@dataclass
class _Build:
    """One build of one spec's environment: where it goes, uv's environment, the users.

    uv builds into `venv` (``<staging>/env``, the build user's); `publish` makes it the
    runner's and renames it to `final` (``<root>/<owner key>/<spec hash>``).
    """

    spec: EnvSpec
    final: Path
    ids: Identities
    log: Log | None
    started: float = field(default_factory=time.monotonic)
    staging: Path | None = None
    inputs: Path | None = None
    cache: Path | None = None
    env: dict[str, str] = field(default_factory=dict)
    home: Path | None = None
    proxy: Egress | None = None  # the job's outbound rule's proxy (None: no rule)

    @property
    def venv(self) -> Path:
        assert self.staging is not None
        return self.staging / "env"

    @property
    def python(self) -> Path:
        return _venv_python(self.venv)

    def result(self, **kw: Any) -> EnvResult:
        for text in ("error", "resolution_note"):  # uv's stderr can be any length
            if text in kw:
                kw[text] = clip(kw[text])
        return EnvResult(seconds=round(time.monotonic() - self.started, 3), **kw)

    def uv(self, *args: str, timeout: float = QUICK_TIMEOUT_S) -> subprocess.CompletedProcess[str]:
        assert self.home is not None
        return run_uv([uv_bin(), *args], self.env, self.log, timeout=timeout, cwd=self.home,
                      ids=self.ids)  # fmt: skip

    def freeze(self) -> list[str] | None:
        proc = self.uv("pip", "freeze", "--python", str(self.python))
        if proc.returncode != 0:
            return None
        return [ln.strip() for ln in proc.stdout.splitlines() if ln.strip()]

    def say(self, line: str) -> None:
        if self.log:
            self.log(line)

    def write_input(self, name: str, lines: list[str]) -> Path:
        """A file uv reads (constraints, names), in the runner's own directory."""
        assert self.inputs is not None
        replace_file(self.inputs, name, "".join(f"{ln}\n" for ln in lines).encode())
        return self.inputs / name

    # -- reuse

    def reused(self) -> EnvResult | None:
        """The recorded build when the environment is published, unchanged and runnable."""
        record = self._record()
        if record is None:
            return None
        self.say(f"reusing {self.final}")
        return self.result(
            ok=True,
            path=str(self.final),
            python_executable=str(_venv_python(self.final)),
            freeze=record["freeze"],
            resolution=record.get("resolution", "free"),
            resolution_note=record.get("resolution_note"),
            reused=True,
        )

    def _record(self) -> dict | None:
        venv, name = self.final, self.final.name
        data = publish.read_record(venv, MARKER)
        if data is None:
            return None  # not published by this runner, or half-way: `publish` replaces it
        try:
            record = json.loads(data)
        except ValueError:
            return None
        python = _venv_python(venv)
        if not isinstance(record, dict) or not python.exists():
            return None
        blocked = blocked_for_all(os.path.realpath(python), self.ids)
        if blocked is not None:
            self.say(f"{name}: its interpreter cannot be run by {blocked}; rebuilding")
            return None
        if record.get("fingerprint") is None:
            self.say(f"{name}: published before its files were fingerprinted; rebuilding")
            return None
        if publish.fingerprint(venv, skip=(MARKER,)) != record["fingerprint"]:
            self.say(f"{name}: its files changed since it was published; rebuilding")
            return None
        return record

    # -- building

    def build(self, pin: str, constraints: list[str]) -> EnvResult:
        venv = self.venv
        base = find_python(self.spec.python, cache_dir=self.cache)
        proc = self.uv("venv", "--no-project", "--relocatable", "--python", base, str(venv))
        if proc.returncode != 0:
            failure = classify(proc, self.proxy, ruled=self.spec.reach is not None)
            return self.result(ok=False, error=meaningful(proc.stderr) or "uv venv failed",
                               failure=failure)  # fmt: skip
        proc, resolution, note = self.install(pin, constraints)
        if proc.returncode != 0 and resolution == "strict" and NO_SOLUTION in proc.stderr:
            # an invalid mix: a skip for the caller, not the candidate's fault
            reason = one_line_reason(proc.stderr)
            failure = Failure(cause=Cause.NO_RESOLUTION, message=reason)
            return self.result(ok=False, error=reason, resolution=resolution, unresolvable=True,
                               failure=failure)  # fmt: skip
        if proc.returncode != 0:
            message = meaningful(proc.stderr) or f"uv pip install exited with {proc.returncode}"
            failure = classify(proc, self.proxy, ruled=self.spec.reach is not None)
            if failure is not None and failure.cause.infrastructure:
                self.say(f"uv pip install: {message}")  # uv's words stay on the runner
                message = failure.message
            return self.result(ok=False, error=message, resolution=resolution,
                               resolution_note=note, failure=failure)  # fmt: skip
        freeze = self.freeze()
        if freeze is None:
            return self.result(ok=False, error="uv pip freeze failed on the new environment")
        try:
            self.publish(base, freeze, resolution, note)
        except (PublishError, OSError) as exc:
            failure = Failure.from_exception(exc)
            return self.result(ok=False, error=f"the build cannot be published: {exc}",
                               failure=failure)  # fmt: skip
        return self.result(
            ok=True,
            path=str(self.final),
            python_executable=str(_venv_python(self.final)),
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
        cfile = self.write_input(CONSTRAINTS_FILE, constraints)
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
        return self.write_input(BASE_FILE, list(held))

    def install_strict(
        self, args: list[str], constraints: list[str]
    ) -> tuple[subprocess.CompletedProcess[str], str, str | None]:
        """A mix (`EnvSpec.strict`): every pin installed exactly, once; nothing is loosened.

        The caller (`build`) turns uv's "no solution" into ``unresolvable``.
        """
        held = dict(_pinned(c) for c in constraints)
        cfile = self.write_input(CONSTRAINTS_FILE, [f"{n}=={v}" for n, v in held.items()])
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
        left: dict[str, str] = {}
        reason = ""
        for _ in range(MAX_FORCED_ROUNDS):
            cfile = self.write_input(CONSTRAINTS_FILE, [f"{n}=={v}" for n, v in held.items()])
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

    def publish(self, base: str, freeze: list[str], resolution: str, note: str | None) -> None:
        """Make the staged environment the runner's, record it, rename it into place.

        Every uv command of the build has returned, and the supervisor kills a command's
        whole tree before it returns: no process of the build is left to race the walk
        (which is safe against one anyway: `runners.publish`).
        """
        assert self.staging is not None and self.inputs is not None
        publish.seize_dir(self.staging)  # root's, 0700: the build user can reach nothing in it
        venv = self.venv
        publish.take_over(venv, self.ids.build)
        for name in (CONSTRAINTS_FILE, BASE_FILE):  # kept beside the environment, as built
            data = publish.read_record(self.inputs, name)
            if data is not None:
                create_file(venv, name, data, 0o444)
        record = {
            "hash": self.final.name,
            "spec": self.spec.model_dump(mode="json"),
            "python": base,
            "freeze": freeze,
            "resolution": resolution,
            "resolution_note": note,
            "built_at": datetime.now(UTC).isoformat(),
            "build_seconds": round(time.monotonic() - self.started, 3),
            "digest": publish.digest(venv, skip=(MARKER,)),
            "fingerprint": publish.fingerprint(venv, skip=(MARKER,)),
        }
        create_file(venv, MARKER, json.dumps(record, indent=1).encode(), 0o444)
        if self.final.exists() or self.final.is_symlink():
            self.say(f"removing the environment it replaces, {self.final}")
            if self.final.is_dir() and not self.final.is_symlink():
                publish.seize_dir(self.final)  # as a user: moving it needs it writable
            os.rename(self.final, self.staging / "replaced")
        os.rename(venv, self.final)
        publish.seal(self.final)  # after the rename: moving a directory needs it writable
        self.say(f"built {self.final} ({resolution}) in {record['build_seconds']} s")


def build_env(
    spec: EnvSpec,
    *,
    root: Path,
    cache_dir: Path | None = None,
    log: Log | None = None,
    owner: str | None = None,
) -> EnvResult:
    """Build (or reuse) the environment for one candidate of `owner`'s.

    ``root/<owner key>/<spec hash>``; `cache_dir` is the cache root (each owner's builds
    use their own cache in it); `owner` is `contract.wire.TrialSpec.owner` (None: a local
    run). Every uv command runs as the build user (`runners.uvrun`). Raises `EnvError`
    for a spec that is wrong in itself; returns ``ok=False`` with uv's message when the
    candidate cannot be installed.
    """
    started = time.monotonic()
    pin, constraints = _validate(spec)
    git = _check_reach(spec)
    root, cache_root = prepare_dirs(root, cache_dir)
    ids = identities()
    _check_find_links(spec, ids)
    _check_source(spec, ids)
    key, who = spec_hash(spec), owner_key(owner)
    owned = publish.child_dir(root, who, 0o711)  # trials enter their own; nobody lists
    locks = publish.child_dir(root, publish.LOCKS, 0o700)
    with publish.locked(locks, f"{who}-{key}.lock"):
        build = _Build(spec, owned / key, ids, log, started)
        found = build.reused()
        if found is not None:
            return found
        with (
            owner_cache(cache_root, owner, ids) as cache,
            private_dir(ids.build, "leakbisect-build-") as home,
            _inputs() as inputs,
            egress(spec.reach) as proxy,  # every connection uv makes, judged by the rule
        ):
            build.staging = publish.staging_dir(root, key, ids.build)
            try:
                build.cache, build.home, build.inputs, build.proxy = cache, home, inputs, proxy
                routed = proxy.env() if proxy is not None else {}
                build.env = uv_env(cache, link_from=root, home=home,
                                   copy=ids.build is not None) | git | routed  # fmt: skip
                _trust_clone(spec, home, ids)
                return build.build(pin, constraints)
            finally:
                safefs.remove_tree(build.staging)
