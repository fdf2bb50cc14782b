"""The CI around `bisect-cli ci`: which CI it runs in, the pull request's one comment, and the
CI job's OIDC identity token.

Rules, in code order:

1. The CI is GitHub Actions (``GITHUB_ACTIONS=true``) or GitLab CI (``GITLAB_CI=true``) unless
   ``--forge`` names one; ``none`` (neither) has no comment and no identity token.
2. The comment's key names one bisection among several in a pull request: letters, digits and
   ``. _ : / @ + -``, up to 100 characters (so the hidden marker cannot be closed early).
3. GitHub: the API from ``GITHUB_API_URL``, the repository from ``GITHUB_REPOSITORY``, the pull
   request from ``--pr`` else the event (``GITHUB_EVENT_PATH``: ``pull_request.number``, or an
   issue comment's pull request), the token from ``GITHUB_TOKEN`` (the action passes its
   ``github-token`` input). GitLab: ``CI_API_V4_URL``, ``CI_PROJECT_ID``, the merge request
   from ``--pr`` else ``CI_MERGE_REQUEST_IID``, the token from ``GITLAB_TOKEN`` (an access
   token with the api scope: ``CI_JOB_TOKEN`` cannot write notes). No host is assumed: the
   CI sets these.
4. One comment per key: its body starts with the hidden marker ``<!-- leakbisect: KEY -->``.
   The first comment that starts with it is edited in place (GitHub PATCH, GitLab PUT), else
   one is posted; comments are read 100 a page, 50 pages at most. Every failure is one line
   (a `LeakbisectError`): the command prints it as a warning, the bisection's result stands.
5. The identity token: on GitHub fetched from ``ACTIONS_ID_TOKEN_REQUEST_URL`` with the
   audience, authorised by ``ACTIONS_ID_TOKEN_REQUEST_TOKEN`` (the workflow needs
   ``permissions: id-token: write``); on GitLab read from the variable that the job's
   ``id_tokens:`` keyword fills, whose ``aud`` must be the audience asked for. Failures are
   one line: missing configuration exits 2, an endpoint that does not answer 1.
"""

import base64
import binascii
import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx

from contract.errors import InvalidInput, Unavailable

TIMEOUT = httpx.Timeout(10.0)
PER_PAGE, MAX_PAGES = 100, 50
KEY = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:/@+-]{0,99}")


class Forge(StrEnum):
    AUTO = "auto"
    GITHUB = "github"
    GITLAB = "gitlab"
    NONE = "none"


def detect(choice: Forge, env: Mapping[str, str]) -> Forge:
    """The CI `choice` names, else the one the environment shows (rule 1)."""
    if choice is not Forge.AUTO:
        return choice
    if env.get("GITHUB_ACTIONS") == "true":
        return Forge.GITHUB
    if env.get("GITLAB_CI") == "true":
        return Forge.GITLAB
    return Forge.NONE


def check_key(key: str) -> str:
    if not KEY.fullmatch(key):
        raise InvalidInput(
            f"{key!r} is not a key: letters, digits and . _ : / @ + -, up to 100 characters",
            field="--comment-key",
        )
    return key


def marker(key: str) -> str:
    return f"<!-- leakbisect: {key} -->"


def _need(env: Mapping[str, str], name: str, why: str) -> str:
    value = env.get(name, "").strip()
    if not value:
        raise InvalidInput(f"{name} is not set; {why}", field="--comment")
    return value


def _one_line(text: str, limit: int = 200) -> str:
    line = " ".join(text.split())
    return line if len(line) <= limit else line[: limit - 3] + "..."


def _checked(response: httpx.Response, what: str) -> httpx.Response:
    """`response` when it is a success; else one line: what failed, the status, the forge's
    message (GitHub's ``message``, GitLab's ``message`` or ``error``)."""
    if response.status_code < 400:
        return response
    try:
        body = response.json()
    except ValueError:
        body = None
    said = body.get("message") or body.get("error") if isinstance(body, dict) else None
    detail = _one_line(str(said or response.text or response.reason_phrase))
    raise Unavailable(f"{what}: HTTP {response.status_code}: {detail}")


@dataclass(frozen=True)
class CommentApi:
    """Where a pull request's comments are: listed and posted at `collection`, edited at
    `item(id)` with `edit_method`; `headers` carry the forge's auth."""

    collection: str
    item_base: str
    headers: dict[str, str]
    edit_method: str

    def item(self, comment_id: Any) -> str:
        return f"{self.item_base}/{comment_id}"


def github_pr(env: Mapping[str, str]) -> str | None:
    """The pull request of the workflow's event, if it has one."""
    path = env.get("GITHUB_EVENT_PATH", "")
    if not path:
        return None
    try:
        event = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None
    pull = event.get("pull_request") if isinstance(event, dict) else None
    if isinstance(pull, dict) and pull.get("number"):
        return str(pull["number"])
    issue = event.get("issue") if isinstance(event, dict) else None
    if isinstance(issue, dict) and issue.get("pull_request") and issue.get("number"):
        return str(issue["number"])
    return None


def comment_api(forge: Forge, env: Mapping[str, str], pr: int | None) -> CommentApi:
    """The comment endpoints of this CI's pull request (rule 3)."""
    if forge is Forge.GITHUB:
        number = str(pr) if pr else github_pr(env)
        if not number:
            raise InvalidInput("this run has no pull request (give --pr N)", field="--comment")
        api = _need(env, "GITHUB_API_URL", "run in GitHub Actions").rstrip("/")
        repo = _need(env, "GITHUB_REPOSITORY", "run in GitHub Actions")
        token = _need(env, "GITHUB_TOKEN", "pass the action's github-token input")
        return CommentApi(
            collection=f"{api}/repos/{repo}/issues/{number}/comments",
            item_base=f"{api}/repos/{repo}/issues/comments",
            headers={
                "Authorization": f"Bearer {token}",
                "Accept": "application/vnd.github+json",
                "X-GitHub-Api-Version": "2022-11-28",
            },
            edit_method="PATCH",
        )
    if forge is Forge.GITLAB:
        number = str(pr) if pr else env.get("CI_MERGE_REQUEST_IID", "")
        if not number:
            raise InvalidInput(
                "this pipeline has no merge request (give --pr N)", field="--comment"
            )
        api = _need(env, "CI_API_V4_URL", "run in GitLab CI").rstrip("/")
        project = quote(_need(env, "CI_PROJECT_ID", "run in GitLab CI"), safe="")
        token = _need(env, "GITLAB_TOKEN", "set a CI variable with an api-scope access token")
        notes = f"{api}/projects/{project}/merge_requests/{number}/notes"
        return CommentApi(notes, notes, {"PRIVATE-TOKEN": token}, "PUT")
    raise InvalidInput("not in GitHub Actions or GitLab CI (give --forge)", field="--comment")


def _find(client: httpx.Client, api: CommentApi, head: str) -> Any:
    """The id of the first comment whose body starts with `head`, or None."""
    for page in range(1, MAX_PAGES + 1):
        response = _checked(
            client.get(api.collection, params={"per_page": PER_PAGE, "page": page}),
            "listing comments",
        )
        comments = response.json()
        for comment in comments if isinstance(comments, list) else []:
            if str(comment.get("body", "")).startswith(head):
                return comment["id"]
        if not isinstance(comments, list) or len(comments) < PER_PAGE:
            return None
    return None


def upsert_comment(api: CommentApi, key: str, text: str) -> tuple[str, Any]:
    """Edit the comment of `key` in place, or post it: ("edited" | "posted", its id)."""
    head = marker(key)
    body = {"body": f"{head}\n{text}"}
    try:
        with httpx.Client(headers=api.headers, timeout=TIMEOUT) as client:
            found = _find(client, api, head)
            if found is not None:
                _checked(client.request(api.edit_method, api.item(found), json=body), "editing")
                return "edited", found
            made = _checked(client.post(api.collection, json=body), "posting").json()
            return "posted", made.get("id") if isinstance(made, dict) else None
    except httpx.HTTPError as exc:
        raise Unavailable(f"cannot reach the forge: {type(exc).__name__}: {exc}") from None


# -- the CI job's OIDC identity token (rule 5)


def github_identity(env: Mapping[str, str], audience: str) -> str:
    url = env.get("ACTIONS_ID_TOKEN_REQUEST_URL", "")
    secret = env.get("ACTIONS_ID_TOKEN_REQUEST_TOKEN", "")
    if not url or not secret:
        raise InvalidInput(
            "ACTIONS_ID_TOKEN_REQUEST_URL is not set: the workflow needs "
            "`permissions: id-token: write`",
            field="--oidc-audience",
        )
    sep = "&" if "?" in url else "?"
    try:
        response = httpx.get(
            f"{url}{sep}audience={quote(audience, safe='')}",
            headers={"Authorization": f"bearer {secret}"},
            timeout=TIMEOUT,
        )
    except httpx.HTTPError as exc:
        raise Unavailable(f"cannot fetch the identity token: {type(exc).__name__}") from None
    _checked(response, "fetching the identity token")
    try:
        value = response.json()["value"]
    except (ValueError, KeyError, TypeError):
        raise Unavailable("the identity token endpoint answered no token") from None
    return str(value)


def audience_of(jwt: str) -> list[str]:
    """A JWT's ``aud`` claim as a list, read without verifying (the server verifies)."""
    try:
        payload = jwt.split(".")[1]
        claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    except (IndexError, ValueError, binascii.Error):
        return []
    aud = claims.get("aud") if isinstance(claims, dict) else None
    return [aud] if isinstance(aud, str) else [a for a in aud or [] if isinstance(a, str)]


def gitlab_identity(env: Mapping[str, str], audience: str, variable: str) -> str:
    value = env.get(variable, "").strip()
    if not value:
        raise InvalidInput(
            f"{variable} is not set: give the job `id_tokens: {variable}: aud: {audience}`",
            field="--oidc-audience",
        )
    if audience not in audience_of(value):
        raise InvalidInput(
            f"{variable} is not a token for the audience {audience!r}: set its id_tokens aud "
            "to the same audience",
            field="--oidc-audience",
        )
    return value


def identity_token(
    forge: Forge, audience: str, variable: str, env: Mapping[str, str] = os.environ
) -> str:
    """The CI job's OIDC identity token for `audience`."""
    if forge is Forge.GITHUB:
        return github_identity(env, audience)
    if forge is Forge.GITLAB:
        return gitlab_identity(env, audience, variable)
    raise InvalidInput(
        "an identity token comes from GitHub Actions or GitLab CI (give --forge)",
        field="--oidc-audience",
    )
