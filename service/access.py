"""Who may do what: a caller (a token's role and name) and the rules on jobs it asks about.

The roles (docs/api.md, docs/security.md), each token with a name:

- API tokens ("client") submit jobs and read and change the jobs they submitted;
- admin tokens read and change every job;
- view tokens ("viewer") read every job and change nothing;
- runner tokens open the runner endpoints only;
- a CI job's OIDC identity token from an issuer in BISECT_OIDC_ISSUERS is a "client"
  named by the issuer's owner rule (service/oidc.py), for the API only;
- "open": no token of any kind and no issuer is configured, so every caller sees and may
  do everything.

A token is matched in constant time against every configured token (no early exit that
would tell which one matched, or how much of it), and never logged or echoed. Only a
token that matches none of them, and reads as a JWT, is checked as an identity token: a
configured token that holds dots stays what it is. The API (service/http/guard.py,
service/http/deps.py: `authenticate`), the page's login (service/web/auth.py: `identify`,
configured tokens only) and the service's reads and actions (service/views.py,
service/actions.py) all ask this module.
"""

import hmac
from dataclasses import dataclass
from typing import Literal

from pydantic import SecretStr

from contract.errors import Unauthenticated
from service.settings import Settings

Role = Literal["open", "client", "admin", "viewer", "runner"]


@dataclass(frozen=True)
class Caller:
    """Who is asking: the token's role and name (None in an open service)."""

    role: Role
    name: str | None = None

    @property
    def sees_all(self) -> bool:
        return self.role in ("open", "admin", "viewer")

    def may_read(self, owner: str | None) -> bool:
        return self.sees_all or (self.role == "client" and owner == self.name)

    def may_change(self, owner: str | None) -> bool:
        return self.role in ("open", "admin") or (self.role == "client" and owner == self.name)


OPEN = Caller("open")


def _match(token: str, configured: list[SecretStr]) -> SecretStr | None:
    given = token.encode()
    found = None
    for candidate in configured:
        # Every token is compared, match or not: the time taken says nothing.
        if hmac.compare_digest(given, candidate.get_secret_value().encode()):
            found = candidate
    return found


def token_lists(settings: Settings) -> list[tuple[Role, list[SecretStr]]]:
    """Every configured token list with the role it gives, in the order that decides the
    role of a token listed twice (the first list wins)."""
    return [
        ("client", settings.api_tokens),
        ("admin", settings.admin_tokens),
        ("viewer", settings.view_tokens),
        ("runner", settings.runner_tokens),
    ]


def identify(settings: Settings, token: str) -> Caller | None:
    """The caller a bearer token stands for, or None when it is no configured token."""
    found: Caller | None = None
    for role, tokens in token_lists(settings):
        match = _match(token, tokens)
        if match is not None and found is None:
            found = Caller(role, getattr(match, "name", None))  # type: ignore[arg-type]
    return found


INVALID = "invalid bearer token"


def authenticate(settings: Settings, token: str) -> Caller:
    """The caller a bearer token stands for on the API: a configured token's, else an
    identity token's when issuers are configured; `Unauthenticated` (or `Unavailable`, an
    issuer's keys out of reach) otherwise."""
    caller = identify(settings, token)
    if caller is not None:
        return caller
    if settings.oidc_issuers:
        # Imported here: PyJWT and cryptography cost every command that reads jobs (`run`
        # included) a noticeable start, and only a server with issuers needs them.
        from service import oidc

        if oidc.is_jwt(token):
            return Caller("client", oidc.verify(settings.oidc_issuers, token))
    raise Unauthenticated(INVALID)
