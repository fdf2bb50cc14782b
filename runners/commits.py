"""Commits between two releases of a package: the tags, the list, and where the source lives.

Rules:

- git runs bounded like a trial (`runners.gitrun`): under the trial supervisor, in a cgroup
  of its own, killed with everything it started (remote helpers, index-pack) at its
  deadline, every process reaped; no terminal prompt (`GIT_TERMINAL_PROMPT=0`, ssh in
  batch mode), `LC_ALL=C`. Any failure (git missing, a non-zero exit, a timeout, a cap)
  is a `CommitsError` with a one-line message, never a traceback.
- A listing (`list_range`) has `LIST_DEADLINE_S` in all; the clone or fetch
  `CLONE_TIMEOUT` of it, every other command `GIT_TIMEOUT`. Over http(s), a transfer
  slower than `LOW_SPEED_BYTES` per second for `LOW_SPEED_S` seconds ends
  (`GIT_HTTP_LOW_SPEED_LIMIT`/`_TIME`).
- A clone or fetch may add at most `MAX_FETCH_BYTES` to the disk (no file larger: the
  kernel's RLIMIT_FSIZE; the directory measured while it runs): "git clone stopped: ...".
- Smart protocols only: every clone and fetch asks for an unlimited depth
  (``--depth=2147483647``), which the smart protocols (http(s), git, ssh) serve as the
  whole history and git's dumb HTTP transport refuses before it fetches any object. A
  dumb server cannot filter out blobs, so it would send the whole repository: it is
  refused in one line. (Checked by git itself in the very request that fetches, so a
  server cannot answer a probe one way and the fetch another.) A clone that comes back
  shallow all the same (a server that cut the history) is refused too.
- `tag_for` tries the usual tag spellings of a release in a fixed order: `v{version}`,
  `{version}`, `{package}-{version}`, `{package}-v{version}`, `{package}@{version}`, then
  the same for the normalized version when it is spelled differently.
- `list_commits` is `git rev-list --reverse --first-parent old..new`: the commits a release
  line went through (a merged branch counts as its merge commit), oldest first, the new
  tag's commit last.
- `checkout_for` uses a local path (or a file:// URL: `bisect-cli run` only) as it is (it
  must be a git repository; git runs as the runner, it is the user's own clone) and
  clones a URL bare and blob-less into the cache (`runners.gitcache`: one clone per URL,
  locked while a listing uses it, least recently used evicted over a size budget), fetched
  again when already there: listing needs only commits and tags, never file contents.
  git runs there as the build user when the runner is root (a repository and its server
  are untrusted input: not root, and not the trial user), never as the runner.
- Where a repository is and how uv names one commit of it: `contract.sources` (pure, the
  service uses it too).

- git sees only a clean environment (PATH, a private HOME, locale, the CA bundle and proxy
  settings; never a ``BISECT_*`` variable or a token), no system or global config (no
  automatic gc or maintenance either: a repack could exceed the fetch cap), and
  `GIT_ALLOW_PROTOCOL`: http(s), git and ssh for a URL, ``file`` only for a local clone
  (a path or a file:// URL, which only `bisect-cli run` takes), never ``ext::``.
- Under the job's outbound rule (`CommitRange.reach`, contract/outbound.py; the API's
  jobs) the repository must be an http(s), git or ssh URL whose host the rule allows
  against the addresses it resolves to here, checked before git starts (an unresolvable
  name, a loopback, private or link-local address: refused in one line naming the rule).
  git then follows no redirect (``http.followRedirects=false``), connects to the
  addresses checked (``http.curloptResolve``), and a clone or fetch that fails says only
  that it failed: neither git's words nor the server's reach the job, so a listing is no
  probe of which ports answer. With no rule (the user's own job) git's reason is shown.
- `list_range` is what a runner's "commits" trial does (runners/trial.py, and
  runners/docker/entry.py in a build container): the good release's tag commit, then every
  commit after it up to the bad release's tag, at most `MAX_COMMITS`.

The API server never runs git: listing clones a repository a job names, which is a
runner's work, as building and resolving are.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

from packaging.version import InvalidVersion, Version

from contract import outbound
from contract.sources import CommitsError, is_url
from contract.wire import (
    MAX_REPORT_COMMITS,
    CommitInfo,
    CommitRange,
    EnvResult,
    TrialReport,
    TrialSpec,
    clip,
)
from runners import gitcache, gitrun
from runners.users import Identity, blocked_by, identities

GIT_TIMEOUT = 30.0
CLONE_TIMEOUT = 300.0
LIST_DEADLINE_S = 360.0  # a whole listing: the clone or fetch, then every read
LOW_SPEED_BYTES = 1000  # bytes per second, over LOW_SPEED_S seconds
LOW_SPEED_S = 30
MAX_FETCH_BYTES = 1 << 30  # what one clone or fetch may add to the disk
# git's INFINITE_DEPTH: the whole history, and a request the dumb HTTP transport refuses.
INFINITE_DEPTH = "2147483647"
_DUMB = "dumb http transport does not support shallow capabilities"
_FETCHING = {"clone": "cloning", "fetch": "fetching"}


@dataclass(frozen=True)
class Commit:
    sha: str
    subject: str


# What git may see of the runner's environment: the CA bundle and proxies, nothing else.
_PASSED = ("PATH", "SSL_CERT_FILE", "SSL_CERT_DIR", "GIT_SSL_CAINFO", "http_proxy",
           "https_proxy", "no_proxy", "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY")  # fmt: skip
URL_PROTOCOLS = "https:http:git:ssh"
LOCAL_PROTOCOLS = URL_PROTOCOLS + ":file"


# Through the environment, so that every git command (and its remote helper) reads them.
_CONFIG = {"gc.auto": "0", "maintenance.auto": "false"}


def _git_env(protocols: str, config: dict[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k in _PASSED}
    if "SSL_CERT_FILE" in env and "GIT_SSL_CAINFO" not in env:
        env["GIT_SSL_CAINFO"] = env["SSL_CERT_FILE"]  # git's curl reads its own variable
    env |= outbound.git_env(_CONFIG | (config or {}))
    return env | {
        "HOME": os.devnull,  # no ~/.gitconfig, no credential store
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_CONFIG_GLOBAL": os.devnull,
        "GIT_TERMINAL_PROMPT": "0",
        "GIT_SSH_COMMAND": "ssh -o BatchMode=yes",
        "GIT_ALLOW_PROTOCOL": protocols,
        "GIT_HTTP_LOW_SPEED_LIMIT": str(LOW_SPEED_BYTES),
        "GIT_HTTP_LOW_SPEED_TIME": str(LOW_SPEED_S),
        "LC_ALL": "C",
    }


@dataclass(frozen=True)
class _Call:
    """Who runs git now, the listing's deadline (`time.monotonic`), if any, and under an
    outbound rule the settings git gets for the URL (`outbound.git_settings`; None: no
    rule, git's own reasons are shown)."""

    run_as: Identity | None = None
    deadline: float | None = None
    ruled: dict[str, str] | None = None


_CALL: ContextVar[_Call] = ContextVar("git_call", default=_Call())  # noqa: B039 - frozen


def _git(
    *args: str,
    cwd: Path | None = None,
    timeout: float = GIT_TIMEOUT,
    protocols: str = LOCAL_PROTOCOLS,
    fetch: gitrun.Fetch | None = None,
) -> str:
    """``git ARGS`` bounded (`runners.gitrun`), as `_CALL`'s user, within its deadline."""
    what = f"git {args[0]}"
    call = _CALL.get()
    late = f"{what} timed out after {timeout:g} s"
    if call.deadline is not None and call.deadline - time.monotonic() < timeout:
        late = f"{what} stopped: listing the commits took longer than {LIST_DEADLINE_S:g} s"
        timeout = max(call.deadline - time.monotonic(), 0.0)
    done = gitrun.run(list(args), cwd=Path(cwd or "/"), env=_git_env(protocols, call.ruled),
                      run_as=call.run_as, timeout=timeout, fetch=fetch)  # fmt: skip
    if done.error is not None:
        if "No such file or directory" in done.error:
            raise CommitsError("git is not installed")
        raise CommitsError(f"{what} could not start: {done.error}")
    if done.timed_out:
        raise CommitsError(late)
    if done.over_cap:
        cap = (fetch.max_bytes if fetch else MAX_FETCH_BYTES) / (1 << 20)
        raise CommitsError(
            f"{what} stopped: the repository sent more than {cap:.3g} MiB, the most a "
            "commits listing fetches"
        )
    if done.over_output:
        raise CommitsError(f"{what} printed more than {gitrun.MAX_OUTPUT >> 20} MiB")
    if _DUMB in done.stderr:
        raise CommitsError(
            f"{what} refused: the server speaks only git's dumb HTTP protocol, which cannot "
            "leave out file contents; a commits listing needs smart HTTP (git http-backend, "
            "any forge)"
        )
    if done.exit_code != 0 and call.ruled is not None and fetch is not None:
        # Under a rule: not git's words ("Couldn't connect", "Empty reply from server").
        raise CommitsError(f"{_FETCHING[args[0]]} the repository failed")
    if done.exit_code != 0:
        raise CommitsError(f"{what} failed: {_reason(done.stderr, done.exit_code or 0)}")
    return done.stdout


def _reason(stderr: str, returncode: int) -> str:
    """git's own first `fatal:`/`error:` line (later lines are advice), else its last line."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    for line in lines:
        for prefix in ("fatal: ", "error: "):
            if line.startswith(prefix):
                return line[len(prefix) :]
    return lines[-1] if lines else f"exit status {returncode}"


def tag_candidates(package: str, version: str) -> list[str]:
    """The tag names `tag_for` tries, in order, without duplicates."""
    forms = [version]
    try:
        normalized = str(Version(version))
    except InvalidVersion:
        normalized = version
    if normalized != version:
        forms.append(normalized)
    out: list[str] = []
    for v in forms:
        for name in (f"v{v}", v, f"{package}-{v}", f"{package}-v{v}", f"{package}@{v}"):
            if name not in out:
                out.append(name)
    return out


def tag_for(repo_dir: Path, package: str, version: str, *, shown: str | None = None) -> str:
    """The first of `tag_candidates` that is a tag in `repo_dir`; CommitsError if none is."""
    listed = _git("for-each-ref", "--format=%(refname:strip=2)", "refs/tags", cwd=repo_dir)
    tags = set(listed.splitlines())
    tried = tag_candidates(package, version)
    for name in tried:
        if name in tags:
            return name
    where = shown or repo_dir
    raise CommitsError(f"no tag for {package} {version} in {where}: tried {', '.join(tried)}")


def list_commits(
    repo_dir: Path, old_tag: str, new_tag: str, *, shown: str | None = None
) -> list[Commit]:
    """The first-parent commits after `old_tag` up to `new_tag`, oldest first."""
    old = _resolve(repo_dir, old_tag)
    new = _resolve(repo_dir, new_tag)
    try:
        _git("merge-base", "--is-ancestor", old, new, cwd=repo_dir)
    except CommitsError:
        raise CommitsError(
            f"{old_tag} is not an ancestor of {new_tag} in {shown or repo_dir}"
        ) from None
    out = _git(
        "rev-list", "--reverse", "--first-parent", "--no-commit-header", "--format=%H%x1f%s",
        f"{old}..{new}", cwd=repo_dir,
    )  # fmt: skip
    commits = [Commit(*line.split("\x1f", 1)) for line in out.splitlines() if line]
    if not commits:
        raise CommitsError(f"no commits between {old_tag} and {new_tag} in {shown or repo_dir}")
    return commits


def tag_commit(repo_dir: Path, tag: str) -> Commit:
    """The commit a tag names: the good bound of a commit search is the good release's."""
    sha = _resolve(repo_dir, tag)
    subject = _git("log", "-1", "--format=%s", sha, cwd=repo_dir).strip()
    return Commit(sha, subject)


def _resolve(repo_dir: Path, ref: str) -> str:
    try:
        return _git("rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}", cwd=repo_dir).strip()
    except CommitsError:
        raise CommitsError(f"{ref} is not a commit in {repo_dir}") from None


@contextmanager
def checkout_for(
    repo: str,
    cache_dir: Path,
    *,
    timeout: float | None = None,
    reach: outbound.Reach | None = None,
) -> Iterator[Path]:
    """A git directory holding `repo`'s commits and tags while the block runs: the path
    itself (a path or a file:// URL), or the cached clone of a URL, fetched again (held:
    nothing else fetches into it or evicts it meanwhile; git runs as its owner). Under
    `reach` the URL must pass it first (`CommitsError`), and git runs under its settings."""
    ruled = None
    if reach is not None:
        try:
            allowed = outbound.check(repo, reach, outbound.GIT_SCHEMES)
        except outbound.Refused as exc:
            raise CommitsError(outbound.describe("repository", repo, exc)) from None
        ruled = outbound.git_settings(allowed)
    local = None if ruled is not None else _local_path(repo)
    if local is not None:
        if not _is_repo_root(local):
            raise CommitsError(f"repo {repo} is not a git repository")
        yield local.resolve()
        return
    owner = identities().build
    root = Path(cache_dir)
    reason = blocked_by(root, owner, "x")
    if reason is not None:
        raise CommitsError(f"git cache {root} is not reachable by {owner}: {reason}")
    try:
        with gitcache.use(root, repo, owner) as slot:
            token = _CALL.set(replace(_CALL.get(), run_as=owner, ruled=ruled))
            try:
                _fetch_into(slot, repo, CLONE_TIMEOUT if timeout is None else timeout)
                yield slot.path
            finally:
                _CALL.reset(token)
    except (gitcache.CacheError, OSError) as exc:
        raise CommitsError(str(exc)) from None


def _local_path(repo: str) -> Path | None:
    """The path a repository names on this machine (a path or a file:// URL), else None."""
    if repo.startswith("file://"):
        return Path(unquote(urlsplit(repo).path))
    return None if is_url(repo) else Path(repo).expanduser()


def _fetch_into(slot: gitcache.Slot, repo: str, timeout: float) -> None:
    """Fetch into the slot's clone, or clone into a new one; refuse a shallow result."""
    refspecs = ["+refs/heads/*:refs/heads/*", "+refs/tags/*:refs/tags/*"]
    if slot.ready:
        # The clone remembers the URL (origin) and the blob filter.
        _git("fetch", "--quiet", "--prune", f"--depth={INFINITE_DEPTH}", "origin", *refspecs,
             cwd=slot.path, timeout=timeout, protocols=URL_PROTOCOLS,
             fetch=gitrun.Fetch(slot.path, MAX_FETCH_BYTES))  # fmt: skip
    else:
        new = slot.fresh()
        _git("clone", "--quiet", "--bare", "--template=", "--filter=blob:none",
             f"--depth={INFINITE_DEPTH}", "--no-single-branch", "--", repo, ".", cwd=new,
             timeout=timeout, protocols=URL_PROTOCOLS,
             fetch=gitrun.Fetch(new, MAX_FETCH_BYTES))  # fmt: skip
        slot.promote()
    if (slot.path / "shallow").exists():
        raise CommitsError(f"repo {repo}: the server sent a shallow history (cut short)")


def _is_repo_root(path: Path) -> bool:
    """A work tree's top or a bare repository; not a directory somewhere inside a repository."""
    if not path.is_dir():
        return False
    try:
        return _git("rev-parse", "--show-prefix", cwd=path).strip() == ""
    except CommitsError:
        return False


MAX_COMMITS = MAX_REPORT_COMMITS


def list_range(
    repo: str,
    package: str,
    good: str,
    bad: str,
    cache_dir: Path,
    reach: outbound.Reach | None = None,
) -> list[Commit]:
    """The commits a commit search bisects: the good release's tag commit (its good bound),
    then the first-parent commits after it up to the bad release's tag, oldest first.
    `reach`: the job's outbound rule (`checkout_for`)."""
    token = _CALL.set(_Call(deadline=time.monotonic() + LIST_DEADLINE_S))
    try:
        with checkout_for(repo, cache_dir, reach=reach) as where:
            old_tag = tag_for(where, package, good, shown=repo)
            new_tag = tag_for(where, package, bad, shown=repo)
            found = [tag_commit(where, old_tag),
                     *list_commits(where, old_tag, new_tag, shown=repo)]  # fmt: skip
    finally:
        _CALL.reset(token)
    if len(found) > MAX_COMMITS:
        raise CommitsError(
            f"{len(found) - 1} commits between {old_tag} and {new_tag}; at most "
            f"{MAX_COMMITS - 1} can be bisected (bisect releases closer together)"
        )
    return found


def answer(commit_range: CommitRange | None, cache_dir: Path) -> dict[str, Any]:
    """A "commits" trial's work, as JSON-ready data (the Docker executor's build container
    prints it): ``{"commits": [{"sha", "subject"}, ...], "seconds"}`` or ``{"error", ...}``."""
    started = time.monotonic()
    try:
        if commit_range is None:
            raise CommitsError("a commits trial needs its commit_range")
        r = commit_range
        found = list_range(r.repo, r.package, r.good, r.bad, Path(cache_dir), r.reach)
        out: dict[str, Any] = {"commits": [{"sha": c.sha, "subject": c.subject[:1000]}
                                           for c in found]}  # fmt: skip
    except CommitsError as exc:
        out = {"error": str(exc)}
    return out | {"seconds": round(time.monotonic() - started, 3)}


def report(spec: TrialSpec, answered: dict[str, Any]) -> TrialReport:
    """The trial's report from `answer`'s data: the commits, or the error as a failed env."""
    seconds = float(answered.get("seconds") or 0.0)
    listed = answered.get("commits")
    if not isinstance(listed, list):
        error = str(answered.get("error") or "listing the commits failed")
        env = EnvResult(ok=False, error=clip(error), seconds=seconds)
        return TrialReport(trial_id=spec.trial_id, attempt=spec.attempt, env=env)
    commits = [CommitInfo.model_validate(c) for c in listed]
    env = EnvResult(ok=True, seconds=seconds)
    return TrialReport(trial_id=spec.trial_id, attempt=spec.attempt, env=env, commits=commits)
