"""Running uv for the environment builder: as the build user, in the allowlisted environment.

Every uv command (``uv venv``, ``uv pip install``, ``uv pip compile``, ``uv pip freeze``,
``uv python find``/``list``) goes through `run_uv`: under the supervisor
(`runners.supervise`, so nothing it starts outlives it), as the build user when the
runner is root (`runners.users`), in its own private HOME, with
`runners.sandbox.allowed_env` (``uv=True``) plus the settings below. Building an sdist
runs its build backend, which is the job's code: it never sees the runner's variables.

Settings every uv command gets: ``UV_PYTHON_DOWNLOADS=never`` (a runner uses the
interpreters installed on it), ``UV_NO_CONFIG=1`` (no uv.toml of the machine decides
what an environment contains), ``UV_NO_PROGRESS=1``, ``NO_COLOR=1``; with a cache,
``UV_CACHE_DIR`` and ``UV_LINK_MODE`` (hard links within one filesystem, else copies;
always copies when the runner is root: `runners.envs` publishes environments as root's,
and a hard link would make the build user's cache file and the published one the same
inode).

`classify` says why a uv command failed (`contract.wire.Cause`), from what the runner knows
for sure, in this order: the egress proxy's own refusals (the strongest evidence: the
proxy decided them), the hosts it was allowed to reach and could not, the supervisor's
timeout (exit 124, its own words), no space left on the device, uv's words for a failed
request (an HTTP error status, a timeout, a connection), then uv's resolver (no version
fits; no wheel or sdist for the platform or Python) and a build that failed. None where
uv's words say none of these (the caller keeps uv's message, a failure of the release as
it always was). Under a rule (`EnvSpec.reach`) the job is told only what the proxy
decided and the cause's own words, never uv's (docs/security.md, what a job is told).

`find_python` picks an interpreter the build *and* trial users can run: with the runner
as root, pyenv's interpreters under /root (mode 0700) are not, and the error names the
directory that blocks. `uv_bin` is the one way leakbisect finds uv.
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from contract.errors import InvalidInput, Unavailable
from contract.wire import Cause, Failure
from runners.egress import Egress
from runners.sandbox import allowed_env, private_dir
from runners.supervise import run
from runners.users import Identities, blocked_by, identities

ERROR_LINES = 20
QUICK_TIMEOUT_S = 300.0
Log = Callable[[str], None]

# uv's progress chatter, never part of an error.
_CHATTER = re.compile(
    r"^(Using (C?Python|Python) |Resolved \d|Prepared \d|Installed \d|Uninstalled \d|Audited \d"
    r"|Downloading |Downloaded |Building |Built |Creating virtual environment|Activate with"
    r"| [-+~] "
    r"|\s+(Updating|Updated|Building) )"  # a git source's fetch and build, indented
)
NO_SOLUTION = "No solution found when resolving"
# uv's words for a request that failed on the way (refused, unreachable, timed out, an HTTP
# error status): what an index or a file URL answered, or that nothing did. Not "Failed to
# download and build", uv's heading for a build that failed after its download.
_NETWORK = re.compile(
    r"Failed to fetch|Failed to download(?! and build)|error sending request"
    r"|Request failed after|HTTP status (client|server) error|tcp connect error|dns error"
    r"|operation timed out",
    re.IGNORECASE,
)
_HTTP_STATUS = re.compile(r"HTTP status (?:client|server) error \((\d{3})")
_REQUEST_TIMED_OUT = re.compile(r"operation timed out|timed out after", re.IGNORECASE)
_NO_SPACE = re.compile(r"No space left on device|os error 28\b")
# The supervisor's words for a command it stopped at its timeout (runners/supervise.py).
_STOPPED = re.compile(r"^error: .* timed out after \d+ s$", re.MULTILINE)
# uv's resolver, when what is missing is a distribution for this platform or Python.
_NO_DISTRIBUTION = re.compile(
    r"has no wheels with a matching|has no (?:usable )?(?:source distribution|wheels? )"
    r"|no wheels (?:are )?available|only has wheels with",
    re.IGNORECASE,
)
# uv's words for a release whose build failed (its sdist's backend, a commit's).
_BUILD_FAILED = re.compile(
    r"Failed to build|Failed to download and build|Build backend failed|failed to build"
)
# What a job under the outbound rule is told of a failed request the proxy did not decide
# (docs/security.md): uv has no way to refuse a redirect or a file URL an index lists, so
# its words would tell a job which addresses and ports answer behind the runner. The
# runner's log keeps them.
FETCH_FAILED = "uv could not fetch from the index or a file it lists (details in the runner's log)"


class EnvError(InvalidInput):
    """A spec that cannot be built as asked; the message is one line. `failure`: why, where
    the runner knows (`classify`), e.g. a resolution that an index's error stopped."""

    def __init__(
        self, message: str, *, field: str | None = None, failure: Failure | None = None
    ) -> None:
        super().__init__(message, field=field)
        self.failure = failure


# --------------------------------------------------------------------------- uv's messages


def meaningful(text: str, limit: int = ERROR_LINES) -> str:
    """uv's stderr without progress chatter or blank lines: the last `limit` lines."""
    lines = [ln.rstrip() for ln in text.splitlines()]
    lines = [ln for ln in lines if ln.strip() and not _CHATTER.match(ln)]
    return "\n".join(lines[-limit:])


def network_failure(stderr: str) -> bool:
    """Whether uv failed on a request (`_NETWORK`), not on what the index held."""
    return _NETWORK.search(stderr) is not None


def classify(
    proc: subprocess.CompletedProcess[str], proxy: Egress | None, *, ruled: bool
) -> Failure | None:
    """Why the uv command `proc` failed, in the order of the module docstring; None when
    uv's words say none of the causes. `proxy`: the build's egress proxy (None: no rule);
    `ruled`: the job is under an outbound rule, so uv's words are not told."""
    stderr = proc.stderr
    if proxy is not None and proxy.refusals:
        refusal = proxy.refusals[0]
        return Failure(
            cause=Cause.REFUSED,
            host=refusal.host,
            rule=refusal.reason,
            message=f"the job's outbound rule refused {refusal.host}: {refusal.reason}",
        )
    if proxy is not None and proxy.unreachable:
        host = proxy.unreachable[0]
        return Failure(cause=Cause.UNREACHABLE, host=host,
                       message=f"{host} could not be reached from the runner")  # fmt: skip
    if proc.returncode == 124 and (stopped := _STOPPED.search(stderr)):
        return Failure(cause=Cause.TIMED_OUT, message=stopped.group(0).removeprefix("error: "))
    if _NO_SPACE.search(stderr):
        return Failure(cause=Cause.DISK_FULL, message="no space left on the runner's device")
    if network_failure(stderr):
        return _request_failed(stderr, ruled)
    if NO_SOLUTION in stderr:
        reason = one_line_reason(stderr)
        missing = _NO_DISTRIBUTION.search(reason)
        cause = Cause.NO_DISTRIBUTION if missing else Cause.NO_RESOLUTION
        return Failure(cause=cause, message=reason)
    if _BUILD_FAILED.search(stderr):
        return Failure(cause=Cause.BUILD_FAILED, message=first_error(stderr))
    return None


def _request_failed(stderr: str, ruled: bool) -> Failure:
    """A request uv made failed and the proxy decided nothing about it: an HTTP error
    status, a timeout, or a connection that failed (no proxy: the user's own job)."""
    status = _HTTP_STATUS.search(stderr)
    own = "" if ruled else f": {_request_words(stderr)}"
    if status is not None:
        return Failure(
            cause=Cause.INDEX_ERROR,
            message=f"an index or a file it lists answered HTTP {status.group(1)}{own}",
        )
    if _REQUEST_TIMED_OUT.search(stderr):
        return Failure(cause=Cause.TIMED_OUT, message=f"a request uv made timed out{own}")
    if ruled:
        return Failure(cause=Cause.UNREACHABLE, message=FETCH_FAILED)
    return Failure(cause=Cause.UNREACHABLE, message=f"uv could not fetch{own}")


def _request_words(stderr: str) -> str:
    """uv's words for a failed request on one line: the URL it fetched and its last cause
    (for a job that is its user's own: no rule, nothing withheld)."""
    lines = [re.sub(r"^(error:|cause:|Caused by:)\s*", "", ln.strip().lstrip("╰─▶│├ "))
             for ln in meaningful(stderr).splitlines()]  # fmt: skip
    lines = [ln for ln in lines if ln and not ln.startswith(("hint:", "Request failed after"))]
    fetched = next((ln for ln in lines if ln.startswith(("Failed to fetch", "Failed to down"))), "")
    last = lines[-1] if lines else "uv gave no reason"
    return last if not fetched or fetched == last else f"{fetched}: {last}"


def one_line_reason(stderr: str) -> str:
    """uv's reason for a failed resolution, joined onto one line."""
    lines = stderr.splitlines()
    start = next((i for i, ln in enumerate(lines) if NO_SOLUTION in ln), None)
    if start is None:
        return first_error(stderr)
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


def first_error(stderr: str) -> str:
    for ln in stderr.splitlines():
        text = ln.strip()
        if text.startswith("error:"):
            return " ".join(text[len("error:") :].split())
    lines = meaningful(stderr).splitlines()
    return " ".join(lines[-1].split()) if lines else "uv gave no reason"


# --------------------------------------------------------------------------- running uv


def uv_bin() -> str:
    """The uv executable: the ``uv`` Python package's binary, else ``uv`` on PATH."""
    try:
        from uv import find_uv_bin

        return find_uv_bin()
    except (ImportError, FileNotFoundError):
        found = shutil.which("uv")
        if found is None:
            raise Unavailable(
                "uv is not installed: neither the uv package nor uv on PATH"
            ) from None
        return found


def _same_filesystem(a: Path, b: Path) -> bool:
    try:
        return a.stat().st_dev == b.stat().st_dev
    except OSError:
        return False


def uv_env(
    cache_dir: Path | None = None,
    link_from: Path | None = None,
    home: Path | None = None,
    *,
    copy: bool = False,
) -> dict[str, str]:
    """The complete environment of a uv command (see the module docstring)."""
    extra = {"UV_PYTHON_DOWNLOADS": "never", "UV_NO_CONFIG": "1", "UV_NO_PROGRESS": "1"}
    extra["NO_COLOR"] = "1"
    if cache_dir is not None:
        extra["UV_CACHE_DIR"] = str(cache_dir)
        if link_from is not None:
            # Hard links only work within one filesystem; elsewhere copy outright
            # rather than have uv try, warn and fall back for every file. `copy`: a
            # published environment must share no inode with a cache the build user
            # writes (runners.publish).
            same = _same_filesystem(cache_dir, link_from) and not copy
            extra["UV_LINK_MODE"] = "hardlink" if same else "copy"
    return allowed_env(home=home or Path("/nonexistent"), uv=True, extra=extra)


def run_uv(
    cmd: list[str],
    env: dict[str, str],
    log: Log | None,
    *,
    timeout: float = QUICK_TIMEOUT_S,
    cwd: Path,
    ids: Identities | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run a uv command as the build user; a timeout is exit 124 with uv-style stderr."""
    if log:
        log("$ " + shlex.join(cmd))
    build = (ids or identities()).build
    proc = run(cmd, env=env, cwd=cwd, run_as=build, timeout=timeout)
    if log and proc.returncode != 0:
        log(f"exit {proc.returncode}: {meaningful(proc.stderr, 5)}")
    return proc


# --------------------------------------------------------------------------- interpreters


def running_python() -> str:
    return f"{sys.version_info.major}.{sys.version_info.minor}"


def blocked_for_all(path: str, ids: Identities) -> str | None:
    for who in ids.users:
        reason = blocked_by(Path(path), who, "x")
        if reason is not None:
            return f"{who}: {reason}"
    return None


def _list_pythons(
    request: str | None, cache_dir: Path | None, ids: Identities | None
) -> list[dict]:
    """``uv python list --only-installed`` as `ids`' build user (None: as the runner)."""
    who = ids.build if ids is not None else None
    try:
        uv = uv_bin()
    except Unavailable:
        return []
    args = [uv, "python", "list", "--only-installed", "--output-format", "json"]
    with private_dir(who, "leakbisect-uv-") as home:
        env = uv_env(cache_dir, home=home)
        proc = run(args + ([request] if request else []), env=env, cwd=home, run_as=who,
                   timeout=QUICK_TIMEOUT_S)  # fmt: skip
    if proc.returncode != 0:
        return []
    try:
        entries = json.loads(proc.stdout)
    except ValueError:
        return []
    return [e for e in entries if isinstance(e, dict) and e.get("path")]


def installed_pythons(cache_dir: Path | None = None) -> list[str]:
    """Versions of the CPythons environments can be built with here (never downloads one):
    when the runner is root, only those the build and trial users can run."""
    ids = identities()
    versions = {
        str(e["version"])
        for e in _list_pythons(None, cache_dir, ids)
        if e.get("implementation", "cpython") == "cpython"
        and e.get("version")
        and blocked_for_all(e["path"], ids) is None
    }

    def key(v: str) -> tuple[int, ...]:
        return tuple(int(p) if p.isdigit() else 0 for p in v.split(".")[:3])

    return sorted(versions, key=key, reverse=True)


def _find(request: str, cache_dir: Path | None, ids: Identities) -> tuple[str, str]:
    """``uv python find`` as the build user: (path, "") or ("", uv's reason)."""
    with private_dir(ids.build, "leakbisect-find-") as home:
        proc = run_uv(
            [uv_bin(), "python", "find", "--no-project", "--no-python-downloads", request],
            uv_env(cache_dir, home=home),
            None,
            cwd=home,  # away from any project's .venv or .python-version
            ids=ids,
        )
    path = proc.stdout.strip().splitlines()[-1].strip() if proc.stdout.strip() else ""
    if proc.returncode != 0 or not path:
        return "", first_error(proc.stderr)
    return path, ""


def find_python(version: str | None, *, cache_dir: Path | None = None) -> str:
    """Path of an installed Python for `version` (the running one's when None).

    Asks ``uv python find`` (as the build user) and never downloads one. When the runner
    is root the interpreter must be runnable by the build and trial users; if uv's choice
    is not, the first installed one that is. Raises `EnvError`: "python 3.99 is not
    available: <uv's reason>" when none is installed, "python 3.11: no installed
    interpreter is reachable by user leakbisect-trial (uid N): /root is mode 0700 ..."
    when only unreachable ones are.
    """
    request = version or running_python()
    ids = identities()
    path, reason = _find(request, cache_dir, ids)
    if path and blocked_for_all(path, ids) is None:
        return path
    candidates = [e["path"] for e in _list_pythons(request, cache_dir, ids)]
    for candidate in candidates:
        if blocked_for_all(candidate, ids) is None:
            return candidate
    if not ids.users:
        raise EnvError(f"python {request} is not available: {reason}", field="python")
    return _unreachable(request, reason, ids)


def _unreachable(request: str, reason: str, ids: Identities) -> str:
    """Raise the right `EnvError` when no interpreter the sandbox users can run was found."""
    # What the runner itself sees: interpreters that exist but are out of the users' reach.
    seen = [e["path"] for e in _list_pythons(request, None, None)]
    blocked = [(p, blocked_for_all(p, ids)) for p in seen]
    blocked = [(p, why) for p, why in blocked if why is not None]
    if not blocked:
        raise EnvError(f"python {request} is not available: {reason}", field="python")
    path, why = blocked[0]
    who, _, detail = why.partition(": ")
    more = f" (and {len(blocked) - 1} more)" if len(blocked) > 1 else ""
    raise EnvError(
        f"python {request}: no installed interpreter is reachable by {who}: {detail} "
        f"({path}{more}); install one outside that directory (e.g. /usr/bin/python{request}) "
        "or make its directories searchable (chmod o+x)",
        field="python",
    )
