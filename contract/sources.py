"""Where a package's source lives and how uv names one commit of it: pure rules the service
(which repository a commits stage lists) and the runners (what they clone and
build) share.

- `repo_from_urls`: the source repository among a release's project URLs (best label first;
  a known forge's URL cut to the repository, or any URL ending in `.git`), or None.
- `source_ref`: the direct reference uv builds one commit from, `git+URL@SHA`; an scp-like
  ssh address becomes `ssh://`, a local path a `file://` URL.
- `is_url`: a repository named by URL (or scp-like ssh), not by a local path.
"""

import re
from collections.abc import Mapping
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

_URL_SCHEMES = ("https://", "http://", "git://", "ssh://", "git+ssh://", "file://")
# `git@github.com:owner/repo.git`, the scp-like ssh form.
_SCP_LIKE = re.compile(r"^[\w.-]+@[\w.-]+:(?!//)")
# PyPI project URL labels that name the source, best first (compared lowercased, without
# spaces, dashes and underscores, as PyPI itself normalizes labels).
_SOURCE_KEYS = ("source", "sourcecode", "repository", "code", "homepage")
_FORGES = ("github.com", "gitlab.com", "codeberg.org", "bitbucket.org")


class CommitsError(Exception):
    """A one-line reason listing commits failed."""


def is_url(repo: str) -> bool:
    return repo.startswith(_URL_SCHEMES) or bool(_SCP_LIKE.match(repo))


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
