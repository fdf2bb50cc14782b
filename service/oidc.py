"""Tokenless CI auth: a CI job's OpenID Connect identity token (GitHub Actions, GitLab CI)
stands in for a client token; its owner is made from its claims by the operator's rule.

The operator lists trusted issuers in BISECT_OIDC_ISSUERS (`service.settings.OidcIssuer`).
A bearer token that is no configured token (those are matched first, in constant time:
service/access.py) and reads as a JWT is checked here, in this order; every refusal is
`Unauthenticated`, one line that starts "OIDC token: " and names what was wrong, never the
token:

1. `_header`: its algorithm is an asymmetric one (`ASYMMETRIC`): `none` and HS* are refused,
   as a shared secret would be anyone's who knows the public JWKS. It names its key (`kid`).
2. `_issuer`: its `iss`, read before the signature only to pick the issuer, is one listed.
3. `_key`: that issuer's key `kid`, from its JWKS (`KeyCache`, below), for that algorithm.
4. `verify`, by PyJWT (`_why` words its refusals): the signature; `exp`, `iat`, `iss` and
   `aud` present; not expired, not before `nbf` or `iat` (each with `LEEWAY_S` for
   clocks); `iss` and `aud` exactly the issuer's.
5. `owner_of`: every claim rule holds (the claim is a string, number or boolean and
   matches the rule's glob, or one of its globs: `fnmatchcase`, where `*` also matches
   `/`), then the owner template is filled in and must be an owner name
   (`settings.OWNER_NAME`).

Keys (`KeyCache`), per issuer and process: fetched when first needed, again after
`KEYS_TTL_S`, and again when a token names a key the cached set lacks (a rotation), at
most once per `REFETCH_S`, so random `kid`s cannot make the server fetch on every request.
After a failed fetch none is tried for `RETRY_S`; cached keys are used meanwhile, and with
none the request is answered 503 (`Unavailable`): the token may be good, the server cannot
tell now, and a client may retry. Fetching (`_get_json`): the discovery document (when no
`jwks_url` is set; its `issuer` must be the issuer) and the JWKS, each over https to a
public address (contract/outbound.py, checked before the connection) unless the operator
listed the host in the issuer's `allow_hosts`; no redirect followed, `MAX_BYTES`,
`TIMEOUT_S`.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from fnmatch import fnmatchcase
from typing import Any, NoReturn

import httpx
import jwt

from contract import outbound
from contract.errors import Unauthenticated, Unavailable
from service.index import _describe, _ssl_verify  # one way to read an index's errors
from service.settings import (
    HOSTS_FIELD,
    OIDC_SETTING,
    OWNER_CHARS,
    OWNER_NAME,
    TEMPLATE_FIELD,
    OidcIssuer,
    discovery_url,
    fetch_refusal,
)

ASYMMETRIC = ("RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512")
REQUIRED = ["exp", "iat", "iss", "aud"]
LEEWAY_S = 30
KEYS_TTL_S = 900.0
REFETCH_S = 60.0
RETRY_S = 15.0
TIMEOUT_S = 10.0
MAX_BYTES = 1024 * 1024
PREFIX = "OIDC token: "


def _refuse(reason: str) -> NoReturn:
    raise Unauthenticated(PREFIX + reason)


def _shown(value: object) -> str:
    """A value from the token, quoted and cut short: it may hold anything."""
    return repr(str(value)[:100])


def _when(value: object) -> str:
    """A NumericDate as UTC ("2024-05-01T12:00:00Z")."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return _shown(value)
    try:
        return datetime.fromtimestamp(value, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    except (ValueError, OverflowError, OSError):
        return _shown(value)


def is_jwt(token: str) -> bool:
    """Whether `token` reads as a JWT (a JSON header, two dots): worth checking here."""
    try:
        jwt.get_unverified_header(token)
    except jwt.PyJWTError:
        return False
    return True


def verify(issuers: list[OidcIssuer], token: str, keys: KeyCache | None = None) -> str:
    """The owner `token` stands for, or `Unauthenticated` (401) saying what was wrong, or
    `Unavailable` (503) when its issuer's keys cannot be had now (the module docstring)."""
    alg, kid = _header(token)
    try:
        unverified = jwt.decode(token, options={"verify_signature": False})
    except jwt.PyJWTError:
        _refuse("malformed (its claims are no JSON object)")
    issuer = _issuer(issuers, unverified.get("iss"))
    key = _key((keys or KEYS).jwk(issuer, kid), issuer, kid, alg)
    try:
        claims = jwt.decode(
            token,
            key=key,
            algorithms=[alg],
            audience=issuer.audience,
            issuer=issuer.issuer,
            leeway=LEEWAY_S,
            options={"require": REQUIRED},
        )
    except jwt.PyJWTError as exc:
        _refuse(_why(exc, issuer, kid, unverified))
    return owner_of(issuer, claims)


def _header(token: str) -> tuple[str, str]:
    header = jwt.get_unverified_header(token)
    alg, kid = header.get("alg"), header.get("kid")
    if alg not in ASYMMETRIC:
        _refuse(f"algorithm {_shown(alg)} is not accepted (only {', '.join(ASYMMETRIC)})")
    if not isinstance(kid, str) or not kid:
        _refuse("its header names no key (kid)")
    return alg, kid


def _issuer(issuers: list[OidcIssuer], iss: object) -> OidcIssuer:
    if iss is None:
        _refuse("it names no issuer (iss)")
    for issuer in issuers:
        if iss == issuer.issuer:
            return issuer
    _refuse(f"issuer {_shown(iss)} is not trusted (not in {OIDC_SETTING})")


def _key(jwk: dict[str, Any], issuer: OidcIssuer, kid: str, alg: str) -> jwt.PyJWK:
    named = jwk.get("alg")
    if named is not None and named != alg:
        _refuse(f"key {_shown(kid)} of {issuer.issuer} is for {_shown(named)}, not {alg}")
    try:
        return jwt.PyJWK(jwk, algorithm=alg)
    except jwt.PyJWTError:
        _refuse(f"key {_shown(kid)} of {issuer.issuer} is no {alg} key")


def _why(exc: jwt.PyJWTError, issuer: OidcIssuer, kid: str, claims: dict[str, Any]) -> str:
    """What PyJWT refused (step 4), in our words. Unless it is the signature, `claims` are
    the signed ones: PyJWT checks the signature first."""
    if isinstance(exc, jwt.InvalidSignatureError):
        return f"bad signature (not made by key {_shown(kid)} of {issuer.issuer})"
    if isinstance(exc, jwt.MissingRequiredClaimError):
        return f"missing claim {exc.claim!r}"
    if isinstance(exc, jwt.ExpiredSignatureError):
        return f"expired at {_when(claims.get('exp'))}"
    if isinstance(exc, jwt.ImmatureSignatureError):
        nbf = claims.get("nbf")
        if isinstance(nbf, int | float) and nbf > time.time() + LEEWAY_S:
            return f"not valid before {_when(nbf)}"
        return f"issued in the future ({_when(claims.get('iat'))})"
    if isinstance(exc, jwt.InvalidAudienceError):
        return f"audience {_shown(claims.get('aud'))} is not this service's ({issuer.audience!r})"
    return f"invalid ({str(exc)[:200]})"


def _claim(claims: dict[str, Any], name: str, issuer: OidcIssuer) -> str:
    """Claim `name` as text (a string, a number or a boolean as JSON writes it)."""
    if name not in claims:
        _refuse(f"missing claim {name!r} (required for {issuer.issuer} by {OIDC_SETTING})")
    value = claims[name]
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str | int | float):
        return str(value)
    _refuse(f"claim {name!r} is no string, number or boolean")


def owner_of(issuer: OidcIssuer, claims: dict[str, Any]) -> str:
    """The owner the issuer's rule makes of verified `claims` (step 5)."""
    for name, rule in issuer.claims.items():
        value = _claim(claims, name, issuer)
        globs = (rule,) if isinstance(rule, str) else rule
        if not any(fnmatchcase(value, glob) for glob in globs):
            wanted = (
                _shown(globs[0]) if len(globs) == 1 else "any of " + ", ".join(map(repr, globs))
            )
            _refuse(f"claim {name} {_shown(value)} does not match {wanted}")
    owner = TEMPLATE_FIELD.sub(lambda m: _claim(claims, m[1], issuer), issuer.owner)
    if not OWNER_NAME.fullmatch(owner):
        _refuse(f"owner {_shown(owner)} made by {issuer.owner!r} is no owner name ({OWNER_CHARS})")
    return owner


@dataclass
class _Keys:
    """One issuer's keys in this process (monotonic times; None: never)."""

    jwks: dict[str, dict[str, Any]] = field(default_factory=dict)  # kid -> JWK
    fetched: float | None = None
    refetched: float | None = None  # by an unknown kid
    failed: float | None = None
    error: str = ""
    lock: threading.Lock = field(default_factory=threading.Lock)


class KeyCache:
    """Issuers' signing keys, fetched and kept as the module docstring says."""

    def __init__(self) -> None:
        self._issuers: dict[tuple[str, str | None, tuple[str, ...]], _Keys] = {}
        self._lock = threading.Lock()

    def _keys(self, issuer: OidcIssuer) -> _Keys:
        with self._lock:
            return self._issuers.setdefault(
                (issuer.issuer, issuer.jwks_url, issuer.allow_hosts), _Keys()
            )

    def jwk(self, issuer: OidcIssuer, kid: str) -> dict[str, Any]:
        """The issuer's key `kid`, fetching its JWKS when due."""
        keys = self._keys(issuer)
        with keys.lock:  # one fetch at a time per issuer; the others then use its keys
            now = time.monotonic()
            due = keys.fetched is None or now - keys.fetched >= KEYS_TTL_S
            rotated = kid not in keys.jwks and (
                keys.refetched is None or now - keys.refetched >= REFETCH_S
            )
            resting = keys.failed is not None and now - keys.failed < RETRY_S
            if (due or rotated) and not resting:
                if not due:
                    keys.refetched = now
                try:
                    keys.jwks, keys.fetched, keys.failed = fetch_keys(issuer), now, None
                except Unavailable as exc:
                    keys.failed, keys.error = now, str(exc)
            if not keys.jwks:
                raise Unavailable(keys.error)
            if kid not in keys.jwks:
                _refuse(f"key {_shown(kid)} is not in the JWKS of {issuer.issuer}")
            return keys.jwks[kid]


KEYS = KeyCache()


def fetch_keys(issuer: OidcIssuer) -> dict[str, dict[str, Any]]:
    """The issuer's signing keys by `kid`, from its JWKS; `Unavailable` when it cannot be had."""
    url = issuer.jwks_url or _jwks_uri(issuer)
    document = _get_json(issuer, url, "JWKS")
    listed = document.get("keys")
    keys = {
        key["kid"]: key
        for key in (listed if isinstance(listed, list) else [])
        if isinstance(key, dict)
        and isinstance(key.get("kid"), str)
        and key.get("use", "sig") == "sig"
    }
    if not keys:
        raise _unavailable(issuer, f"JWKS {url}", "holds no signing key with a kid")
    return keys


def _jwks_uri(issuer: OidcIssuer) -> str:
    url = discovery_url(issuer.issuer)
    document = _get_json(issuer, url, "discovery")
    if document.get("issuer") != issuer.issuer:
        raise _unavailable(
            issuer, f"discovery {url}", f"names issuer {_shown(document.get('issuer'))}"
        )
    jwks_uri = document.get("jwks_uri")
    if not isinstance(jwks_uri, str):
        raise _unavailable(issuer, f"discovery {url}", "has no jwks_uri")
    return jwks_uri


def _unavailable(issuer: OidcIssuer, what: str, reason: str) -> Unavailable:
    return Unavailable(f"cannot check OIDC tokens of {issuer.issuer} now: {what}: {reason}")


def _allowed(url: str, issuer: OidcIssuer) -> str | None:
    """Why `url` may not be fetched now (its addresses checked), or None."""
    reason = fetch_refusal(url, issuer.allow_hosts)
    if reason is not None:
        return reason
    target = outbound.parse(url)
    try:
        outbound.allow(target, outbound.Reach(hosts=issuer.allow_hosts), setting=HOSTS_FIELD)
        return None  # listed: the operator vouched for it
    except outbound.Refused:
        pass
    try:
        outbound.allow(target, outbound.Reach(), setting=HOSTS_FIELD)
    except outbound.Refused as exc:
        return str(exc)
    return None


def _get_json(issuer: OidcIssuer, url: str, what: str) -> dict[str, Any]:
    where = f"{what} {url}"
    refused = _allowed(url, issuer)
    if refused is not None:
        raise _unavailable(issuer, where, refused)
    body = bytearray()
    try:
        with (
            httpx.Client(timeout=TIMEOUT_S, verify=_ssl_verify(), trust_env=True) as client,
            client.stream("GET", url, headers={"Accept": "application/json"}) as response,
        ):
            if response.status_code != 200:
                raise _unavailable(issuer, where, f"answered {response.status_code}")
            for chunk in response.iter_bytes():
                body += chunk
                if len(body) > MAX_BYTES:
                    raise _unavailable(issuer, where, f"sent more than {MAX_BYTES >> 20} MiB")
    except httpx.HTTPError as exc:
        raise _unavailable(issuer, where, _describe(exc, TIMEOUT_S)) from None
    try:
        document = json.loads(body)
    except ValueError:
        raise _unavailable(issuer, where, "is not JSON") from None
    if not isinstance(document, dict):
        raise _unavailable(issuer, where, "is not a JSON object")
    return document
