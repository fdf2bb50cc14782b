"""Settings from the environment (`BISECT_*`), behind a cached getter."""

import hashlib
import json
import os
import re
from functools import lru_cache
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from contract import outbound
from contract.errors import InvalidInput
from contract.paths import cache_home, uv_cache_dir


def _data_home() -> Path:
    base = os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share"
    return Path(base) / "leakbisect"


def _cache_home() -> Path:
    # One definition with the runners': $XDG_CACHE_HOME/leakbisect, for root
    # /var/cache/leakbisect (the trial and build users cannot enter /root), else ~/.cache.
    return cache_home()


TOKEN_NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")
# The name of a job's owner: a token's name, or what a CI identity token's owner template
# makes (service/oidc.py), which adds ':', '/' and '@' since a repository
# ("github:myorg/app") names its owner best.
OWNER_NAME = re.compile(r"[A-Za-z0-9_.:/@-]{1,128}")
OWNER_CHARS = "letters, digits, _ . - : / @; at most 128"


class NamedToken(SecretStr):
    """A bearer token and the name jobs submitted with it are recorded under.

    Configured as ``name:token``; a plain ``token`` is named ``token-`` plus the first 8
    hex digits of its SHA-256 (stable across restarts and reorderings, and no secret).
    """

    def __init__(self, secret: str, name: str | None = None) -> None:
        super().__init__(secret)
        self.name = name or f"token-{hashlib.sha256(secret.encode()).hexdigest()[:8]}"


def parse_tokens(text: str) -> list[NamedToken]:
    tokens = []
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        name, sep, secret = item.partition(":")
        if sep and secret and TOKEN_NAME.fullmatch(name):
            tokens.append(NamedToken(secret, name))
        else:
            tokens.append(NamedToken(item))
    return tokens


def parse_groups(text: str) -> list[frozenset[str]]:
    """Trust groups, ';' between groups and ',' between owner names; each name in one group."""
    groups: list[frozenset[str]] = []
    seen: set[str] = set()
    for part in filter(None, (p.strip() for p in text.split(";"))):
        names = [n.strip() for n in part.split(",") if n.strip()]
        for name in names:
            if not OWNER_NAME.fullmatch(name):  # a token's name or a CI identity's owner
                raise ValueError(f"{name!r} is not an owner name ({OWNER_CHARS})")
            if name in seen:
                raise ValueError(f"{name} is in two groups; an owner belongs to one at most")
            seen.add(name)
        if len(names) < 2:
            raise ValueError(f"the group {part!r} has one owner; a group needs two or more")
        groups.append(frozenset(names))
    return groups


# `{claim}` in an owner template; every other brace is refused.
TEMPLATE_FIELD = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")
OIDC_SETTING = "BISECT_OIDC_ISSUERS"
HOSTS_FIELD = f"allow_hosts of {OIDC_SETTING}"


def fetch_refusal(url: str, allow_hosts: tuple[str, ...]) -> str | None:
    """Why the API may not fetch `url` for an issuer (its discovery or JWKS), before any
    name lookup, or None: an https URL, or an http one whose host the operator listed (a
    loopback or private issuer). Whether an unlisted host is public is decided at fetch
    time, against its addresses then (service/oidc.py)."""
    try:
        target = outbound.parse(url)
    except outbound.Refused as exc:
        return str(exc)
    if target.scheme == "https":
        return None
    try:
        outbound.allow(target, outbound.Reach(hosts=allow_hosts), setting=HOSTS_FIELD)
    except outbound.Refused:
        return "plain http is fetched only from a host listed in allow_hosts"
    return None


class OidcIssuer(BaseModel):
    """One trusted issuer of CI identity tokens, an item of BISECT_OIDC_ISSUERS (README,
    "Tokenless CI auth"). A token it signed, for `audience`, whose claims match every rule
    of `claims` (a glob, or a list of globs one of which must match), is a client token
    named by `owner` with each ``{claim}`` filled in."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    issuer: str = Field(min_length=1, max_length=500)  # exactly the tokens' `iss`
    audience: str = Field(min_length=1, max_length=500)  # the `aud` a token must name
    owner: str = Field(min_length=1, max_length=200)  # e.g. "github:{repository}"
    claims: dict[str, str | tuple[str, ...]] = Field(max_length=50)
    # Unset: `jwks_uri` of {issuer}/.well-known/openid-configuration.
    jwks_url: str | None = Field(default=None, max_length=2000)
    # Hosts (host or host:port) whose discovery and JWKS may be fetched over http or at a
    # private address: the operator vouches for them. Others: https to public addresses.
    allow_hosts: tuple[str, ...] = Field(default=(), max_length=100)

    @field_validator("allow_hosts")
    @classmethod
    def _lower(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(host.strip().lower() for host in value if host.strip())

    @field_validator("owner")
    @classmethod
    def _template(cls, value: str) -> str:
        literal = TEMPLATE_FIELD.sub("", value)
        if "{" in literal or "}" in literal:
            raise ValueError(f"owner {value!r}: only {{claim}} placeholders are filled in")
        if literal and not OWNER_NAME.fullmatch(literal):
            raise ValueError(f"owner {value!r}: an owner name holds {OWNER_CHARS}")
        return value

    @field_validator("claims")
    @classmethod
    def _rules(cls, value: dict[str, str | tuple[str, ...]]) -> dict[str, str | tuple[str, ...]]:
        if not value:
            # GitHub's and gitlab.com's issuers sign for every user's jobs, for any audience.
            raise ValueError(
                "at least one rule (e.g. repository_owner): with none, any job of the "
                "issuer would be let in, every user's of a shared forge"
            )
        for name, rule in value.items():
            if not name or rule == () or "" in ((rule,) if isinstance(rule, str) else rule):
                raise ValueError(f"claims: {name!r} needs a non-empty value or list of values")
        return value

    @model_validator(mode="after")
    def _fetchable(self) -> "OidcIssuer":
        try:
            outbound.parse(self.issuer)
        except outbound.Refused as exc:
            raise ValueError(f"issuer {self.issuer!r}: {exc}") from None
        first = self.jwks_url or discovery_url(self.issuer)
        reason = fetch_refusal(first, self.allow_hosts)
        if reason is not None:
            raise ValueError(f"issuer {self.issuer}: {first}: {reason}")
        return self


def discovery_url(issuer: str) -> str:
    """Where an issuer's OpenID configuration is (OpenID Connect Discovery 1.0, 4)."""
    return issuer.rstrip("/") + "/.well-known/openid-configuration"


def parse_issuers(text: str) -> list[Any]:
    """BISECT_OIDC_ISSUERS's JSON: a list of issuer objects (empty: no OIDC)."""
    if not text.strip():
        return []
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise ValueError(f"not JSON ({exc}); a list of issuer objects, see the README") from None
    if not isinstance(value, list):
        raise ValueError("a JSON list of issuer objects, see the README")
    issuers = [i.get("issuer") for i in value if isinstance(i, dict)]
    twice = sorted({str(i) for i in issuers if issuers.count(i) > 1})
    if twice:
        raise ValueError(f"issuer {twice[0]} is listed twice; one entry per issuer")
    return value


# Comma-separated in the environment; SecretStr so a printed Settings never shows them.
Tokens = Annotated[list[SecretStr], NoDecode]


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="BISECT_", extra="ignore")

    # Factories, not values: the XDG variables are read when Settings are made, not at import.
    data_dir: Path = Field(default_factory=_data_home)
    # Environments and the shared uv cache live together so uv can hard-link.
    cache_dir: Path = Field(default_factory=_cache_home)
    database_url: str | None = None

    # Bearer tokens, comma-separated `name:token` (or plain `token`): API tokens submit and
    # read their own jobs, admin tokens see and cancel all, view tokens read all (the web
    # page) and change nothing, runner tokens run trials. None configured means an open
    # service (and `serve` binds 127.0.0.1 only).
    api_tokens: Tokens = Field(default_factory=list)
    admin_tokens: Tokens = Field(default_factory=list)
    view_tokens: Tokens = Field(default_factory=list)
    runner_tokens: Tokens = Field(default_factory=list)
    # Tokenless CI auth (service/oidc.py): trusted issuers of CI identity tokens, a JSON
    # list of {issuer, audience, owner, claims, jwks_url?, allow_hosts?} (OidcIssuer). A
    # token one of them signed is a client token named by its owner template. An issuer
    # closes the service like a token does (`auth_enabled`).
    oidc_issuers: Annotated[list[OidcIssuer], NoDecode] = Field(default_factory=list)
    # Verdict reuse stays within one owner (a token's name); owners an admin lists together
    # here share verdicts as one trust group (service/reuse.py rule 3): "alice,bob;carol,dave".
    reuse_groups: Annotated[list[frozenset[str]], NoDecode] = Field(default_factory=list)
    # With no tokens the API answers only requests whose Host is one of these (DNS
    # rebinding: a web page must not reach a loopback API by a name it controls).
    trusted_hosts: Annotated[list[str], NoDecode] = Field(
        default_factory=lambda: ["127.0.0.1", "localhost", "::1"]
    )
    # The status page's session cookies (service/web/auth.py) are signed with this key;
    # unset, a random one is made on first use and kept in data_dir/session.key (0600), so
    # a cookie never follows from the tokens and survives a restart. Set it (32+ characters)
    # when several hosts serve one site.
    secret_key: SecretStr | None = None
    # Cookies are always Secure with this set (a TLS proxy in front), else only when the
    # request came over https, as the connection or a proxy from forwarded_allow_ips says
    # (its X-Forwarded-Proto and X-Forwarded-For, read by uvicorn; "*" trusts any).
    secure_cookies: bool = False
    forwarded_allow_ips: str = "127.0.0.1"
    # Login guesses (per client address, service/web/auth.py): after this many failures in
    # a row the next try must wait 1 s, and each further failure doubles the wait up to
    # login_max_delay_s; a try too soon is answered 429 with Retry-After.
    login_free_failures: int = Field(default=5, ge=1)
    login_max_delay_s: float = Field(default=300.0, gt=0)
    # Live event streams (the status page's SSE, service/web/events.py) one client may hold
    # open at once, per server process; the next is answered 429.
    max_streams: int = Field(default=8, ge=1)
    # Leases: a runner must heartbeat (every heartbeat_s) before lease_s passes, or
    # the reaper (every reap_interval_s; 0 turns the background thread off) requeues
    # its trial; after max_attempts expired leases the trial is an error.
    lease_s: float = Field(default=30.0, gt=0)
    heartbeat_s: float = Field(default=10.0, gt=0)
    max_attempts: int = Field(default=3, ge=1)
    reap_interval_s: float = Field(default=5.0, ge=0)
    # A runner seen within this many seconds counts as a free slot for k-section.
    runner_live_s: float = Field(default=60.0, gt=0)
    # Limits per owner (a token's name; every tokenless job is one owner), so that one
    # tenant cannot fill the queue (issue 26): a submission beyond either is answered 429
    # (service/policy.py). Active jobs are queued or running; queued trials wait for a runner.
    max_active_jobs: int = Field(default=20, ge=1)
    max_queued_trials: int = Field(default=200, ge=1)
    # Limits per job: a range of more releases is refused at submission (413), and a job
    # that needs more trials than its budget stops with an error (service/scheduler.py),
    # so a runaway search ends instead of running for ever.
    max_candidates: int = Field(default=500, ge=2)
    max_trials_per_job: int = Field(default=1000, ge=1)
    # Slow clients (`serve`, service/cli/serve.py): a request's head must arrive within
    # header_timeout_s of the connection (or of the previous response), its body within
    # body_timeout_s of its head, else the connection is closed; an idle keep-alive
    # connection closes after keep_alive_s; beyond max_connections, requests get 503.
    header_timeout_s: float = Field(default=10.0, gt=0)
    body_timeout_s: float = Field(default=60.0, gt=0)
    keep_alive_s: float = Field(default=5.0, gt=0)
    max_connections: int = Field(default=1000, ge=1)
    # Base of the job URLs the API hands out (e.g. https://bisect.example.com);
    # default: the base URL of the request.
    public_url: str | None = None
    # Hosts a job's URLs may name: indexes, find-links and repositories (comma-separated,
    # host or host:port, "*" for any; contract/outbound.py). Unset: any public host when
    # tokens are configured, any host at all when they are not (the API then listens on
    # loopback only).
    allowed_indexes: Annotated[list[str], NoDecode] = Field(default_factory=list)
    index_max_bytes: int = Field(default=64 * 1024 * 1024, gt=0)
    # Webhooks (service/webhooks.py): when a job ends, a JSON POST signed with
    # webhook_secret (HMAC-SHA256, README "Webhooks") goes to the job's --webhook URL and to
    # webhook_url, the operator's for every job (never stored, logged or shown: it may be a
    # capability URL). Without a secret the service sends none and refuses --webhook.
    webhook_url: str | None = None
    webhook_secret: SecretStr | None = None
    # Hosts a job's webhook may reach (host or host:port, "*" any; contract/outbound.py):
    # unset, any host whose addresses are all public, with or without tokens (the server
    # posts, so a tokenless one is no exception). The operator's own URL is not held to it.
    webhook_hosts: Annotated[list[str], NoDecode] = Field(default_factory=list)
    # Seconds a delivery attempt may take (connect, send, read) before it counts as failed.
    webhook_timeout_s: float = Field(default=10.0, gt=0, le=300)
    # The waits before each retry: 5 attempts in all over about 7 minutes by default, long
    # enough to ride out a receiver's restart or deploy, short enough that a CI step
    # waiting on the hook is not left hanging. Comma-separated seconds.
    webhook_backoff_s: Annotated[list[float], NoDecode] = Field(
        default_factory=lambda: [10.0, 30.0, 90.0, 270.0], max_length=20
    )
    # How often the API's delivery loop looks for due deliveries (0: no loop).
    webhook_interval_s: float = Field(default=2.0, ge=0)
    # Whether a runner's GPUs count as held by its trials alone, so that device-level
    # memory may stand in where NVML gives no per-process figure (runners.nvml.open_probe).
    gpu_exclusive: Literal["auto", "yes", "no"] = "auto"

    @field_validator("allowed_indexes", "trusted_hosts", "webhook_hosts", mode="before")
    @classmethod
    def _split_hosts(cls, value: Any) -> Any:
        if isinstance(value, str):
            return [host.strip().lower() for host in value.split(",") if host.strip()]
        return value

    @field_validator("webhook_backoff_s", mode="before")
    @classmethod
    def _split_backoff(cls, value: Any) -> Any:
        if isinstance(value, str):
            return [part.strip() for part in value.split(",") if part.strip()]
        return value

    @field_validator("webhook_backoff_s")
    @classmethod
    def _backoff_bounded(cls, value: list[float]) -> list[float]:
        if any(not 0 <= wait <= 86400 for wait in value):
            raise ValueError("each wait is 0 to 86400 seconds")
        return value

    @field_validator("webhook_url")
    @classmethod
    def _webhook_url(cls, value: str | None) -> str | None:
        if not value:
            return None
        try:
            outbound.parse(value)
        except outbound.Refused as exc:
            raise ValueError(str(exc)) from None  # the URL itself is not repeated: a secret
        return value

    @model_validator(mode="after")
    def _webhooks_signed(self) -> "Settings":
        if self.webhook_url and self.webhook_secret is None:
            raise ValueError(
                "BISECT_WEBHOOK_URL needs BISECT_WEBHOOK_SECRET: every webhook is signed"
            )
        return self

    @field_validator("secret_key", "webhook_secret", mode="before")
    @classmethod
    def _empty_is_unset(cls, value: Any) -> Any:
        # compose passes `${BISECT_SECRET_KEY:-}`: an empty variable means "none configured".
        return None if value == "" else value

    @field_validator("secret_key", "webhook_secret")
    @classmethod
    def _long_enough(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None and len(value.get_secret_value()) < 32:
            raise ValueError(
                "at least 32 characters, e.g. from "
                "python -c 'import secrets; print(secrets.token_urlsafe(32))'"
            )
        return value

    @field_validator("api_tokens", "admin_tokens", "view_tokens", "runner_tokens", mode="before")
    @classmethod
    def _split_tokens(cls, value: Any) -> Any:
        if isinstance(value, str):
            return parse_tokens(value)
        if isinstance(value, list):
            return [NamedToken(v) if isinstance(v, str) else v for v in value]
        return value

    @field_validator("oidc_issuers", mode="before")
    @classmethod
    def _parse_issuers(cls, value: Any) -> Any:
        return parse_issuers(value) if isinstance(value, str) else value

    @field_validator("reuse_groups", mode="before")
    @classmethod
    def _split_groups(cls, value: Any) -> Any:
        return parse_groups(value) if isinstance(value, str) else value

    @property
    def auth_enabled(self) -> bool:
        tokens = self.api_tokens or self.admin_tokens or self.view_tokens or self.runner_tokens
        return bool(tokens or self.oidc_issuers)

    @property
    def effective_database_url(self) -> str:
        return self.database_url or f"sqlite:///{self.data_dir / 'leakbisect.db'}"

    @property
    def env_root(self) -> Path:
        return self.cache_dir / "envs"

    @property
    def uv_cache_dir(self) -> Path:
        # A user's own UV_CACHE_DIR wins: sharing it makes cold builds warm.
        return uv_cache_dir(self.cache_dir)


@lru_cache
def get_settings() -> Settings:
    """The settings from the environment; a bad value is an InvalidInput naming its variable."""
    try:
        return Settings()
    except ValidationError as exc:
        first = exc.errors()[0]
        loc = first.get("loc") or ()
        text = str(first["msg"]).removeprefix("Value error, ")
        if not loc:  # a rule between settings: its message names them
            raise InvalidInput(text) from None
        # Inside a list of objects (BISECT_OIDC_ISSUERS): which item, which field.
        where = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in loc[1:])
        raise InvalidInput(f"BISECT_{str(loc[0]).upper()}{where}: {text}") from None
