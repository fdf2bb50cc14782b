"""Where a job's URLs may lead: one rule for every URL a job names (its index, extra
indexes, find-links and repository, and its webhook), pure but for one name lookup. The
API server applies it at submission and to every request it makes itself (service/policy.py,
service/index.py, service/webhooks.py right before each delivery, under its own host list);
a runner applies it again right before git or uv starts
(runners/commits.py, runners/envs.py), against the addresses the name resolves to there.

Rules, in code order:

1. `parse`: a URL is ``scheme://host[:port]/...`` with a host. No control character,
   space or backslash anywhere (parsers disagree on them: Python's drops a newline that
   httpx refuses; WHATWG parsers read a backslash as a slash, Python's does not). A host
   is letters, digits, ``.``, ``-``, ``_`` (an international name in its ``xn--`` form),
   or an IPv6 address in brackets. An IPv4 address is four decimal numbers: the other
   forms ``inet_aton`` reads (``2130706433``, ``0177.0.0.1``, ``0x7f.1``, ``127.1``) are
   refused with the plain form to write instead, since a check and a connection that read
   them differently would be a way past the rule.
2. `public`: an address is public when Python calls it global and it is not multicast; an
   IPv6 address that carries an IPv4 one (mapped ``::ffff:a.b.c.d``, compatible
   ``::a.b.c.d``, 6to4 ``2002::/16``, NAT64 ``64:ff9b::/96``) is judged by that IPv4
   address. Loopback, private, link-local, shared (100.64/10), reserved: not public.
3. `Reach`: what a job may reach. ``hosts``: only these hosts (``host`` or ``host:port``,
   ``*`` any; the deployment's BISECT_ALLOWED_INDEXES), taken as named: the operator
   vouched for them. With no list, any host whose addresses are all public. No `Reach` at
   all (None) is a job that is its user's own (`bisect-cli run`, a service with no
   tokens): anything goes, and git's and uv's own words come back as they are.
4. `allow`: a URL under a `Reach`, or `Refused` saying why not. A listed host passes as
   it is named. Otherwise a literal address must be public; a name must
   resolve, and every address it resolves to must be public (a name that does not
   resolve is refused: it cannot be shown safe). The addresses it was judged by come back
   (`Allowed`), so a caller can connect to exactly those (git's ``http.curloptResolve``):
   a name that answers one way to the check and another to the connection is the gap
   left where a caller cannot pin (uv, httpx; docs/security.md).
5. `git_settings`: git under a rule follows no redirect (``http.followRedirects=false``:
   the place a redirect names was never checked) and connects to the addresses checked.
   uv has no setting to refuse an index's redirect; its index URLs are checked before it
   starts, and the git it runs for a source build inherits these settings.

Each refusal is `Refused`, one line naming the host and what to do; callers add which URL
(`Malformed`, a kind of it, for a URL to be shown quoted: it may hold anything).
"""

from __future__ import annotations

import ipaddress
import re
import socket
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from urllib.parse import SplitResult, urlsplit

from pydantic import BaseModel, ConfigDict, Field

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Resolver = Callable[[str, int], Sequence[str]]

# The setting an operator lists hosts in (service/settings.py `allowed_indexes`); webhooks
# name their own (`webhook_hosts`, service/webhooks.py).
SETTING = "BISECT_ALLOWED_INDEXES"
DEFAULT_PORTS = {"http": 80, "https": 443, "git": 9418, "ssh": 22}
# What a repository URL may use under a rule (git's GIT_ALLOW_PROTOCOL for a URL).
GIT_SCHEMES = ("https", "http", "git", "ssh")
_NAME = re.compile(r"[a-z0-9_]([a-z0-9_-]*[a-z0-9_])?(\.[a-z0-9_]([a-z0-9_-]*[a-z0-9_])?)*\.?")
# One part of an inet_aton address: decimal, octal (leading 0) or hex (0x).
_NUMERIC_PART = re.compile(r"0x[0-9a-f]*|[0-9]+")
_NAT64 = ipaddress.ip_network("64:ff9b::/96")


class Refused(ValueError):
    """A URL the rule refuses; ``str`` is the one-line reason."""


class Malformed(Refused):
    """A URL that is no URL (rule 1 before the host): show it quoted, it may hold anything."""


@dataclass(frozen=True)
class Target:
    """A parsed URL: its scheme, host (lowercase, IPv6 without brackets) and port."""

    scheme: str
    host: str
    port: int

    @property
    def address(self) -> Address | None:
        """The host when it is an address, else None (a name)."""
        try:
            return ipaddress.ip_address(self.host)
        except ValueError:
            return None


def parse(url: str, schemes: Sequence[str] = ("http", "https")) -> Target:
    """`url` as a `Target` (rule 1); `Refused` when it is malformed or of another scheme."""
    if any(ch.isspace() or ord(ch) < 0x20 or ord(ch) == 0x7F or ch == "\\" for ch in url):
        raise Malformed("a URL holds no space, control character or backslash")
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise Malformed(f"not a URL: {exc}") from None
    scheme = parts.scheme.lower()
    if not scheme:
        raise Malformed(f"not a URL: no scheme (write {schemes[0]}://...)")
    if scheme not in schemes:
        raise Refused(f"only {', '.join(schemes)} URLs are taken, not {scheme}://")
    host = _host(parts)
    return Target(scheme, host, port or DEFAULT_PORTS.get(scheme, 0))


def _host(parts: SplitResult) -> str:
    host = (parts.hostname or "").lower()
    if not host:
        raise Malformed("the URL has no host")
    bracketed = "[" in parts.netloc
    if bracketed:
        try:
            ipaddress.IPv6Address(host)
            return host
        except ValueError:
            raise Refused(f"host [{host}] is not an IPv6 address") from None
    if not _NAME.fullmatch(host):
        raise Refused(
            f"host {host} holds characters a host name cannot (write an international "
            "name in its xn-- form)"
        )
    plain = _inet_aton(host.rstrip("."))
    if plain is not None and host != str(plain):
        raise Refused(f"host {host} is an address in a form parsers disagree on; write {plain}")
    return host


def _inet_aton(host: str) -> ipaddress.IPv4Address | None:
    """The IPv4 address C's inet_aton (and so curl and git) reads in `host`, if any."""
    parts = host.split(".")
    if not 1 <= len(parts) <= 4 or not all(_NUMERIC_PART.fullmatch(p) for p in parts):
        return None
    try:
        numbers = [int(p, 16) if p.startswith("0x") else int(p, 8 if len(p) > 1 and
                   p.startswith("0") else 10) for p in parts]  # fmt: skip
    except ValueError:  # "0x", or an 8 or 9 in an octal part: not an address, a bad name
        return None
    *head, last = numbers
    if any(n > 255 for n in head) or last >= 256 ** (4 - len(head)):
        return None
    value = last
    for i, n in enumerate(head):
        value |= n << (8 * (3 - i))
    return ipaddress.IPv4Address(value)


def public(address: Address) -> bool:
    """Rule 2: whether `address` is a public unicast address, embedded IPv4 included."""
    if isinstance(address, ipaddress.IPv6Address):
        inner = address.ipv4_mapped or address.sixtofour
        if inner is None and int(address) >> 32 == 0 and int(address) > 1:  # ::a.b.c.d
            inner = ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
        if inner is None and address in _NAT64:
            inner = ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
        if inner is not None:
            return public(inner)
    return address.is_global and not address.is_multicast


class Reach(BaseModel):
    """Rule 3: what a job may reach; None in its place: anything (the user's own job)."""

    model_config = ConfigDict(frozen=True)

    # The hosts listed (host or host:port, "*" any); None: any host with public addresses.
    hosts: tuple[str, ...] | None = Field(default=None, max_length=1000)


@dataclass(frozen=True)
class Allowed:
    """A URL the rule lets through, and the addresses it was judged by (none when listed)."""

    target: Target
    addresses: tuple[Address, ...] = ()


def _getaddrinfo(host: str, port: int) -> list[str]:
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return [str(info[4][0]) for info in infos]


def allow(
    target: Target, reach: Reach, resolve: Resolver = _getaddrinfo, setting: str = SETTING
) -> Allowed:
    """Rule 4: `target` under `reach`, or `Refused` saying why not; `setting` is where the
    operator lists hosts (the refusals name it: webhooks and OIDC issuers have their own)."""
    host, port = target.host, target.port
    if reach.hosts is not None:
        named = {host, f"{host}:{port}", f"[{host}]", f"[{host}]:{port}"}
        if "*" in reach.hosts or named & set(reach.hosts):
            return Allowed(target)
        raise Refused(f"host {host} is not in {setting}")
    address = target.address
    if address is not None:
        found: list[Address] = [address]
    else:
        try:
            found = [ipaddress.ip_address(a.split("%", 1)[0]) for a in resolve(host, port)]
        except (OSError, UnicodeError, ValueError):
            found = []
        if not found:
            raise Refused(f"host {host} was not found (a name must resolve to be checked)")
    if not all(public(a) for a in found):
        raise Refused(f"host {host} is not a public address (list it in {setting})")
    return Allowed(target, tuple(found))


def check(
    url: str,
    reach: Reach | None,
    schemes: Sequence[str] = ("http", "https"),
    resolve: Resolver = _getaddrinfo,
    setting: str = SETTING,
) -> Allowed:
    """`parse` then, under a `reach`, `allow`: the one call every caller makes."""
    target = parse(url, schemes)
    return Allowed(target) if reach is None else allow(target, reach, resolve, setting)


def describe(what: str, url: str, exc: Refused) -> str:
    """The one line a client is told: ``index URL: reason`` (a malformed URL quoted)."""
    if isinstance(exc, Malformed):
        return f"{what} {url!r}: {exc}"
    return f"{what} {url.rstrip('/')}: {exc}"


def curl_resolve(allowed: Allowed) -> str | None:
    """The ``HOST:PORT:ADDR[,ADDR]`` entry (curl's CURLOPT_RESOLVE, git's
    ``http.curloptResolve``) that makes a connection use the addresses checked."""
    if not allowed.addresses or allowed.target.address is not None:
        return None
    shown = [f"[{a}]" if a.version == 6 else str(a) for a in allowed.addresses]
    return f"{allowed.target.host}:{allowed.target.port}:{','.join(dict.fromkeys(shown))}"


def git_settings(allowed: Allowed) -> dict[str, str]:
    """What git is told for a URL the rule let through: follow no redirect (the place it
    names was not checked), and, for a name, connect to the addresses checked."""
    settings = {"http.followRedirects": "false"}
    pinned = curl_resolve(allowed)
    if pinned is not None:
        settings["http.curloptResolve"] = pinned
    return settings


def git_env(settings: dict[str, str]) -> dict[str, str]:
    """`settings` as git's ``GIT_CONFIG_COUNT``/``_KEY_n``/``_VALUE_n`` variables, which
    every git command and remote helper reads (and uv's git, which inherits them)."""
    env = {"GIT_CONFIG_COUNT": str(len(settings))}
    for i, (key, value) in enumerate(settings.items()):
        env[f"GIT_CONFIG_KEY_{i}"], env[f"GIT_CONFIG_VALUE_{i}"] = key, value
    return env
