"""Commits between two releases of a package: the tags, the list, and where the source lives.

Rules:

- git runs as a subprocess, with a timeout, no terminal prompt (`GIT_TERMINAL_PROMPT=0`,
  ssh in batch mode) and `LC_ALL=C`; any failure (git missing, a non-zero exit, a timeout)
  is a `CommitsError` with a one-line message, never a traceback.
- `tag_for` tries the usual tag spellings of a release in a fixed order: `v{version}`,
  `{version}`, `{package}-{version}`, `{package}-v{version}`, `{package}@{version}`, then
  the same for the normalized version when it is spelled differently.
- `list_commits` is `git rev-list --reverse --first-parent old..new`: the commits a release
  line went through (a merged branch counts as its merge commit), oldest first, the new
  tag's commit last.
- `checkout_for` uses a local path as it is (it must be a git repository) and clones a URL
  bare and blob-less into the cache (fetched again when already there): listing needs only
  commits and tags, never file contents.
- `repo_from_urls` and `source_ref` are pure.

- git sees only a clean environment (PATH, a private HOME, locale, the CA bundle and proxy
  settings; never a ``BISECT_*`` variable or a token), no system or global config, and
  `GIT_ALLOW_PROTOCOL`: http(s), git and ssh for a URL, ``file`` only for a local clone
  (a path or a file:// URL, which only `bisect-cli run` takes), never ``ext::``.
- `list_range` is what a runner's "commits" trial does (runners/trial.py, and
  runners/docker_entry.py in a build container): the good release's tag commit, then every
  commit after it up to the bad release's tag, at most `MAX_COMMITS`.

The API server never runs git: listing clones a repository a job names, which is a
runner's work, as building and resolving are. `repo_from_urls` and `source_ref` are pure
and used by the service too.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from packaging.version import InvalidVersion, Version

from runners.wire import (
    MAX_REPORT_COMMITS,
    CommitInfo,
    CommitRange,
    EnvResult,
    TrialReport,
    TrialSpec,
)

GIT_TIMEOUT = 30.0
CLONE_TIMEOUT = 300.0
_URL_SCHEMES = ("https://", "http://", "git://", "ssh://", "git+ssh://", "file://")
# `git@github.com:owner/repo.git`, the scp-like ssh form.
_SCP_LIKE = re.compile(r"^[\w.-]+@[\w.-]+:(?!//)")
# PyPI project URL labels that name the source, best first (compared lowercased, without
# spaces, dashes and underscores, as PyPI itself normalizes labels).
_SOURCE_KEYS = ("source", "sourcecode", "repository", "code", "homepage")
_FORGES = ("github.com", "gitlab.com", "codeberg.org", "bitbucket.org")


class CommitsError(Exception):
    """A one-line reason listing commits failed."""


@dataclass(frozen=True)
class Commit:
    sha: str
    subject: str


# What git may see of the runner's environment: the CA bundle and proxies, nothing else.
_PASSED = ("PATH", "SSL_CERT_FILE", "SSL_CERT_DIR", "GIT_SSL_CAINFO", "http_proxy",
           "https_proxy", "no_proxy", "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY")  # fmt: skip
URL_PROTOCOLS = "https:http:git:ssh"
LOCAL_PROTOCOLS = URL_PROTOCOLS + ":file"


def _git_env(protocols: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k in _PASSED}
    if "SSL_CERT_FILE" in env and "GIT_SSL_CAINFO" not in env:
        env["GIT_SSL_CAINFO"] = env["SSL_CERT_FILE"]  # git's curl reads its own variable
    return env | {
        "HOME": os.devnull,  # no ~/.gitconfig, no credential store
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_CONFIG_GLOBAL": os.devnull,
        "GIT_TERMINAL_PROMPT": "0",
        "GIT_SSH_COMMAND": "ssh -o BatchMode=yes",
        "GIT_ALLOW_PROTOCOL": protocols,
        "LC_ALL": "C",
    }


def _git(
    *args: str,
    cwd: Path | None = None,
    timeout: float = GIT_TIMEOUT,
    protocols: str = LOCAL_PROTOCOLS,
) -> str:
    what = f"git {args[0]}"
    try:
        done = subprocess.run(
            ["git", *args], cwd=cwd, env=_git_env(protocols), capture_output=True, text=True,
            timeout=timeout,
        )  # fmt: skip
    except FileNotFoundError:
        raise CommitsError("git is not installed") from None
    except subprocess.TimeoutExpired:
        raise CommitsError(f"{what} timed out after {timeout:g} s") from None
    if done.returncode != 0:
        raise CommitsError(f"{what} failed: {_reason(done.stderr, done.returncode)}")
    return done.stdout


def _reason(stderr: str, returncode: int) -> str:
    """git's own first `fatal:`/`error:` line (later lines are advice), else its last line."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    for line in lines:
        for prefix in ("fatal: ", "error: "):
            if line.startswith(prefix):
                return line[len(prefix) :]
    return lines[-1] if lines else f"exit status {returncode}"


def is_url(repo: str) -> bool:
    return repo.startswith(_URL_SCHEMES) or bool(_SCP_LIKE.match(repo))


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


def checkout_for(repo: str, cache_dir: Path, *, timeout: float = CLONE_TIMEOUT) -> Path:
    """A git directory holding `repo`'s commits and tags: the path itself, or a cached clone."""
    if not is_url(repo):
        path = Path(repo).expanduser()
        if not _is_repo_root(path):
            raise CommitsError(f"repo {repo} is not a git repository")
        return path.resolve()
    # A file:// URL is the user's own clone (`bisect-cli run`; the API takes http(s) only).
    protocols = LOCAL_PROTOCOLS if repo.startswith("file://") else URL_PROTOCOLS
    dest = Path(cache_dir) / hashlib.sha256(repo.encode()).hexdigest()[:16]
    refspecs = ["+refs/heads/*:refs/heads/*", "+refs/tags/*:refs/tags/*"]
    if (dest / "HEAD").is_file():
        # The clone remembers the URL (origin) and the blob filter.
        _git("fetch", "--quiet", "--prune", "origin", *refspecs, cwd=dest, timeout=timeout,
             protocols=protocols)  # fmt: skip
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    partial = dest.with_name(dest.name + f".partial-{os.getpid()}")
    try:
        _git("clone", "--quiet", "--bare", "--filter=blob:none", "--", repo, str(partial),
             timeout=timeout, protocols=protocols)  # fmt: skip
        partial.rename(dest)
    finally:
        if partial.exists():
            shutil.rmtree(partial, ignore_errors=True)
    return dest


def _is_repo_root(path: Path) -> bool:
    """A work tree's top or a bare repository; not a directory somewhere inside a repository."""
    if not path.is_dir():
        return False
    try:
        return _git("rev-parse", "--show-prefix", cwd=path).strip() == ""
    except CommitsError:
        return False


def source_ref(repo: str, sha: str) -> str:
    """The direct reference uv builds one commit from: `git+URL@SHA`."""
    if repo.startswith("git+"):
        url = repo[len("git+") :]
    elif _SCP_LIKE.match(repo):
        user_host, _, path = repo.partition(":")
        url = f"ssh://{user_host}/{path}"
    elif is_url(repo):
        url = repo
    else:
        url = Path(repo).expanduser().resolve().as_uri()
    return f"git+{url}@{sha}"


def repo_from_urls(project_urls: Mapping[str, str]) -> str | None:
    """The source repository among a release's project URLs, or None.

    Keys are tried best first (Source, Source Code, Repository, Code, Homepage; labels
    compared case- and punctuation-insensitively); a value counts when it is on a known forge
    or ends in `.git`. A forge URL is cut to the repository (`/tree/...`, `/blob/...`,
    `/-/...`, `/src/...` go); nothing is added.
    """
    by_key = {re.sub(r"[\s_-]", "", k.lower()): v for k, v in project_urls.items()}
    for key in _SOURCE_KEYS:
        url = _repo_url(by_key.get(key, "").strip())
        if url is not None:
            return url
    return None


def _repo_url(value: str) -> str | None:
    parts = urlsplit(value)
    if parts.scheme not in ("https", "http", "git", "ssh") or not parts.netloc:
        return None
    host = parts.netloc.lower().removeprefix("www.")
    path = parts.path.rstrip("/")
    if host in _FORGES:
        segments = [s for s in path.split("/") if s]
        cut = next(
            (i for i, s in enumerate(segments) if s in ("-", "tree", "blob", "src", "commit")),
            len(segments),
        )
        segments = segments[:cut] if host == "gitlab.com" else segments[: min(cut, 2)]
        if len(segments) < 2:
            return None
        path = "/" + "/".join(segments)
    elif not path.endswith(".git"):
        return None
    return urlunsplit((parts.scheme, parts.netloc, path, "", ""))


MAX_COMMITS = MAX_REPORT_COMMITS


def list_range(repo: str, package: str, good: str, bad: str, cache_dir: Path) -> list[Commit]:
    """The commits a commit search bisects: the good release's tag commit (its good bound),
    then the first-parent commits after it up to the bad release's tag, oldest first."""
    where = checkout_for(repo, cache_dir)
    old_tag = tag_for(where, package, good, shown=repo)
    new_tag = tag_for(where, package, bad, shown=repo)
    found = [tag_commit(where, old_tag), *list_commits(where, old_tag, new_tag, shown=repo)]
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
        found = list_range(r.repo, r.package, r.good, r.bad, Path(cache_dir))
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
        env = EnvResult(ok=False, error=error, seconds=seconds)
        return TrialReport(trial_id=spec.trial_id, attempt=spec.attempt, env=env)
    commits = [CommitInfo.model_validate(c) for c in listed]
    env = EnvResult(ok=True, seconds=seconds)
    return TrialReport(trial_id=spec.trial_id, attempt=spec.attempt, env=env, commits=commits)
