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
resolution and says why. "As released" builds pass ``--exclude-newer``.

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
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

from runners.wire import EnvResult, EnvSpec

try:  # POSIX; on other systems concurrent builds of one spec are not serialized.
    import fcntl
except ImportError:  # pragma: no cover
    fcntl = None  # type: ignore[assignment]

__all__ = [
    "EnvError",
    "build_env",
    "default_cache_dir",
    "exclude_newer_arg",
    "find_python",
    "freeze_diff",
    "resolve_pins",
    "spec_hash",
]

MARKER = ".leakbisect-env.json"
CONSTRAINTS_FILE = "leakbisect-constraints.txt"
ERROR_LINES = 20
# A cold install of a large stack (torch and friends) can take many minutes.
INSTALL_TIMEOUT_S = 3600.0
QUICK_TIMEOUT_S = 300.0

Log = Callable[[str], None]

# uv settings from the caller's environment that only say how to reach an index
# (TLS, credentials, timeouts); every other UV_* variable is dropped so that the
# spec alone decides what an environment contains.
_UV_PASSTHROUGH = re.compile(
    r"UV_(NATIVE_TLS|SYSTEM_CERTS|INSECURE_HOST|HTTP_TIMEOUT|HTTP_RETRIES|REQUEST_TIMEOUT"
    r"|KEYRING_PROVIDER|OFFLINE|CONCURRENT_\w+|INDEX_\w+_(USERNAME|PASSWORD))"
)
# uv's progress chatter, never part of an error.
_CHATTER = re.compile(
    r"^(Using (C?Python|Python) |Resolved \d|Prepared \d|Installed \d|Uninstalled \d|Audited \d"
    r"|Downloading |Downloaded |Building |Built |Creating virtual environment|Activate with"
    r"| [-+~] )"
)
_NO_SOLUTION = "No solution found when resolving"


class EnvError(Exception):
    """A spec that cannot be built as asked; the message is one line."""


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
        data["python"] = _running_python()
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


def _running_python() -> str:
    return f"{sys.version_info.major}.{sys.version_info.minor}"


def _parse_requirement(text: str, what: str = "requirement") -> Requirement:
    try:
        return Requirement(text)
    except InvalidRequirement as exc:
        reason = str(exc).splitlines()[0] if str(exc) else "invalid"
        raise EnvError(f"{what} {text!r} does not parse: {reason}") from None


def _validate(spec: EnvSpec) -> tuple[str, list[str]]:
    """Check a spec; return the candidate's pin and the constraints to pass on."""
    if not spec.package or not re.fullmatch(
        r"[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?", spec.package
    ):
        raise EnvError(f"package {spec.package!r} is not a valid project name")
    pin = f"{spec.package}=={spec.version}"
    _parse_requirement(pin)
    for req in spec.requirements:
        _parse_requirement(req)
    own = canonicalize_name(spec.package)
    constraints = []
    for text in spec.constraints:
        if canonicalize_name(_parse_requirement(text, "constraint").name) != own:
            constraints.append(text)
    return pin, constraints


def _meaningful(text: str, limit: int = ERROR_LINES) -> str:
    """uv's stderr without progress chatter or blank lines: the last `limit` lines."""
    lines = [ln.rstrip() for ln in text.splitlines()]
    lines = [ln for ln in lines if ln.strip() and not _CHATTER.match(ln)]
    return "\n".join(lines[-limit:])


def _one_line_reason(stderr: str) -> str:
    """uv's reason for a failed resolution, joined onto one line."""
    lines = stderr.splitlines()
    start = next((i for i, ln in enumerate(lines) if _NO_SOLUTION in ln), None)
    if start is None:
        return _first_error(stderr)
    parts = []
    for ln in lines[start + 1 :]:
        text = ln.strip().lstrip("╰─▶│├ ").strip()
        if not text or text.startswith("hint:"):
            break
        text = re.sub(r"^(cause:|Caused by:)\s*", "", text)
        parts.append(text)
    if not parts:
        return re.sub(r"^(error:|×)\s*", "", lines[start].strip())
    return " ".join(" ".join(parts).split())


def _first_error(stderr: str) -> str:
    for ln in stderr.splitlines():
        text = ln.strip()
        if text.startswith("error:"):
            return " ".join(text[len("error:") :].split())
    meaningful = _meaningful(stderr).splitlines()
    return " ".join(meaningful[-1].split()) if meaningful else "uv gave no reason"


# ---------------------------------------------------------------------------
# running uv


def _uv() -> str:
    try:
        from uv import find_uv_bin

        return find_uv_bin()
    except (ImportError, FileNotFoundError):
        found = shutil.which("uv")
        if found is None:
            raise EnvError("uv is not installed: neither the uv package nor uv on PATH") from None
        return found


def default_cache_dir() -> Path:
    """The per-user uv cache the builds share: ``$UV_CACHE_DIR`` when set, else
    ``$XDG_CACHE_HOME/leakbisect/uv`` (``~/.cache/leakbisect/uv``)."""
    if os.environ.get("UV_CACHE_DIR"):
        return Path(os.environ["UV_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "leakbisect" / "uv"


def _same_filesystem(a: Path, b: Path) -> bool:
    try:
        return a.stat().st_dev == b.stat().st_dev
    except OSError:
        return False


def _uv_env(cache_dir: Path | None = None, link_from: Path | None = None) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not (k.startswith("UV_") and not _UV_PASSTHROUGH.fullmatch(k))
        and k not in ("VIRTUAL_ENV", "PYTHONHOME")
    }
    env.update(
        UV_PYTHON_DOWNLOADS="never",
        UV_NO_CONFIG="1",
        UV_NO_PROGRESS="1",
        NO_COLOR="1",
    )
    if cache_dir is not None:
        env["UV_CACHE_DIR"] = str(cache_dir)
        if link_from is not None:
            # Hard links only work within one filesystem; elsewhere copy outright
            # rather than have uv try, warn and fall back for every file.
            same = _same_filesystem(cache_dir, link_from)
            env["UV_LINK_MODE"] = "hardlink" if same else "copy"
    return env


def _run(
    cmd: list[str],
    env: dict[str, str],
    log: Log | None,
    *,
    timeout: float = QUICK_TIMEOUT_S,
    cwd: Path | None = None,
) -> subprocess.CompletedProcess[str]:
    if log:
        log("$ " + shlex.join(cmd))
    try:
        proc = subprocess.run(
            cmd,
            env=env,
            cwd=cwd,
            capture_output=True,
            text=True,
            errors="replace",
            timeout=timeout,
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired:
        # Same shape as a failure, so callers handle one case.
        return subprocess.CompletedProcess(
            cmd, 124, "", f"error: {cmd[1]} {cmd[2]} timed out after {timeout:.0f} s"
        )
    if log and proc.returncode != 0:
        log(f"exit {proc.returncode}: {_meaningful(proc.stderr, 5)}")
    return proc


def find_python(version: str | None) -> str:
    """Path of an installed Python for `version` (the running one's when None).

    Asks ``uv python find`` and never downloads one. Raises `EnvError`
    ("python 3.99 is not available: <uv's reason>") when none is installed.
    """
    request = version or _running_python()
    with tempfile.TemporaryDirectory(prefix="leakbisect-find-") as cwd:
        proc = _run(
            [_uv(), "python", "find", "--no-project", "--no-python-downloads", request],
            _uv_env(),
            None,
            cwd=Path(cwd),  # away from any project's .venv or .python-version
        )
    path = proc.stdout.strip().splitlines()[-1].strip() if proc.stdout.strip() else ""
    if proc.returncode != 0 or not path:
        raise EnvError(f"python {request} is not available: {_first_error(proc.stderr)}")
    return path


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
    with the spec's index options; the spec's own constraints are not applied
    (these pins are what later specs get as constraints). `cache_dir` as for
    `build_env`. Raises `EnvError` with uv's one-line reason when it cannot
    resolve.
    """
    pin, _ = _validate(spec)
    python = spec.python or _running_python()
    with tempfile.TemporaryDirectory(prefix="leakbisect-pins-") as tmp:
        reqs = Path(tmp) / "requirements.in"
        reqs.write_text("\n".join([pin, *spec.requirements]) + "\n")
        cmd = [
            _uv(), "pip", "compile", str(reqs),
            "--python-version", python,
            "--no-header", "--no-annotate", "--no-strip-markers",
            *index_args(spec),
        ]  # fmt: skip
        cache = Path(cache_dir) if cache_dir is not None else default_cache_dir()
        proc = _run(cmd, _uv_env(cache), None, cwd=Path(tmp))
    if proc.returncode != 0:
        raise EnvError(f"cannot resolve {pin}: {_one_line_reason(proc.stderr)}")
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


def _freeze(python: Path, env: dict[str, str], log: Log | None) -> list[str] | None:
    proc = _run([_uv(), "pip", "freeze", "--python", str(python)], env, log)
    if proc.returncode != 0:
        return None
    return [ln.strip() for ln in proc.stdout.splitlines() if ln.strip()]


def _remove(path: Path) -> None:
    if path.is_symlink() or path.is_file():
        path.unlink()
    elif path.exists():
        shutil.rmtree(path)


def _reuse(venv: Path, env: dict[str, str], log: Log | None) -> dict | None:
    """The marker's record when the environment is complete and unchanged."""
    marker = venv / MARKER
    try:
        record = json.loads(marker.read_text())
    except (OSError, ValueError):
        return None
    python = _venv_python(venv)
    if not python.exists():
        return None
    freeze = _freeze(python, env, log)
    if freeze is None or freeze != record.get("freeze"):
        if log:
            log(f"{venv.name}: installed packages differ from the recorded build; rebuilding")
        return None
    return record


def build_env(
    spec: EnvSpec,
    *,
    root: Path,
    cache_dir: Path | None = None,
    log: Log | None = None,
) -> EnvResult:
    """Build (or reuse) the environment for one candidate under ``root/<spec-hash>``.

    Raises `EnvError` for a spec that is wrong in itself; returns ``ok=False``
    with uv's message when the candidate cannot be installed.
    """
    started = time.monotonic()
    pin, constraints = _validate(spec)
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    cache = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    cache.mkdir(parents=True, exist_ok=True)
    env = _uv_env(cache, link_from=root)
    key = spec_hash(spec)
    venv = root / key
    python = _venv_python(venv)

    def result(**kw) -> EnvResult:
        return EnvResult(seconds=round(time.monotonic() - started, 3), **kw)

    with _locked(root / f"{key}.lock"):
        record = _reuse(venv, env, log) if (venv / MARKER).exists() else None
        if record is not None:
            if log:
                log(f"reusing {venv}")
            return result(
                ok=True,
                path=str(venv),
                python_executable=str(python),
                freeze=record["freeze"],
                resolution=record.get("resolution", "free"),
                resolution_note=record.get("resolution_note"),
                reused=True,
            )
        if venv.exists() or venv.is_symlink():
            if log:
                log(f"removing incomplete environment {venv}")
            _remove(venv)

        base = find_python(spec.python)
        proc = _run(
            [_uv(), "venv", "--no-project", "--python", base, str(venv)], env, log, cwd=root
        )
        if proc.returncode != 0:
            _remove(venv)
            return result(ok=False, error=_meaningful(proc.stderr) or "uv venv failed")

        install = [
            _uv(), "pip", "install", "--python", str(python), pin, *spec.requirements,
            *index_args(spec),
        ]  # fmt: skip
        resolution = "as-released" if spec.exclude_newer is not None else "free"
        note = None
        if spec.constraints:
            cfile = venv / CONSTRAINTS_FILE
            cfile.write_text("".join(f"{c}\n" for c in constraints))
            proc = _run([*install, "-c", str(cfile)], env, log, timeout=INSTALL_TIMEOUT_S)
            if proc.returncode == 0:
                resolution = "as-released" if spec.exclude_newer is not None else "constrained"
            elif _NO_SOLUTION in proc.stderr:
                reason = _one_line_reason(proc.stderr)
                note = f"held pins did not resolve, resolved freely: {reason}"
                if log:
                    log(note)
                proc = _run(install, env, log, timeout=INSTALL_TIMEOUT_S)
        else:
            proc = _run(install, env, log, timeout=INSTALL_TIMEOUT_S)
        if proc.returncode != 0:
            _remove(venv)
            message = _meaningful(proc.stderr) or f"uv pip install exited with {proc.returncode}"
            return result(ok=False, error=message, resolution=resolution, resolution_note=note)

        freeze = _freeze(python, env, log)
        if freeze is None:
            _remove(venv)
            return result(ok=False, error="uv pip freeze failed on the new environment")
        record = {
            "hash": key,
            "spec": spec.model_dump(mode="json"),
            "python": base,
            "freeze": freeze,
            "resolution": resolution,
            "resolution_note": note,
            "built_at": datetime.now(UTC).isoformat(),
            "build_seconds": round(time.monotonic() - started, 3),
        }
        tmp = venv / f"{MARKER}.tmp"
        tmp.write_text(json.dumps(record, indent=1))
        os.replace(tmp, venv / MARKER)
        if log:
            log(f"built {venv} ({resolution}) in {record['build_seconds']} s")
        return result(
            ok=True,
            path=str(venv),
            python_executable=str(python),
            freeze=freeze,
            resolution=resolution,
            resolution_note=note,
        )
