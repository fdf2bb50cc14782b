"""Tokenless CI auth (service/oidc.py) through the real app: RSA and EC key pairs made here,
a real JWKS and OpenID configuration served by http.server on 127.0.0.1, tokens signed
with the test's keys and sent as `Authorization: Bearer`.

The issuers are stand-ins for GitHub's and GitLab's (the forges cannot be reached here):
real HTTP servers with real keys, whose tokens carry the claims those forges put in theirs.
"""

import json
import logging
import socket
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from fastapi.testclient import TestClient

from contract.errors import InvalidInput
from service.app import create_app
from service.settings import get_settings
from tests.test_api_auth import bearer, job_body, settings

API = "/api/v1"
AUDIENCE = "https://bisect.test"
STATIC = "alice.static.token"  # a configured client token with dots: not a JWT
PrivateKey = rsa.RSAPrivateKey | ec.EllipticCurvePrivateKey


@pytest.fixture(scope="module")
def keys() -> dict[str, PrivateKey]:
    return {
        "rsa-1": rsa.generate_private_key(public_exponent=65537, key_size=2048),
        "rsa-2": rsa.generate_private_key(public_exponent=65537, key_size=2048),
        "stranger": rsa.generate_private_key(public_exponent=65537, key_size=2048),
        "ec-1": ec.generate_private_key(ec.SECP256R1()),
    }


def public_jwk(private: PrivateKey, kid: str) -> dict[str, Any]:
    if isinstance(private, rsa.RSAPrivateKey):
        jwk = jwt.algorithms.RSAAlgorithm.to_jwk(private.public_key(), as_dict=True)
        alg = "RS256"
    else:
        jwk = jwt.algorithms.ECAlgorithm.to_jwk(private.public_key(), as_dict=True)
        alg = "ES256"
    return jwk | {"kid": kid, "alg": alg, "use": "sig"}


class StandInIssuer:
    """An OIDC issuer on 127.0.0.1: its discovery document and JWKS, with a count of
    requests per path; `jwks_status` other than 200 makes the JWKS fail."""

    def __init__(self) -> None:
        self.jwks: dict[str, Any] = {"keys": []}
        self.jwks_uri: str | None = None  # default: its own /jwks
        self.named_issuer: str | None = None  # default: itself
        self.jwks_status = 200
        self.hits: Counter[str] = Counter()
        issuer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                issuer.hits[self.path] += 1
                status, body = issuer.answer(self.path)
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def answer(self, path: str) -> tuple[int, object]:
        if path == "/.well-known/openid-configuration":
            return 200, {
                "issuer": self.named_issuer or self.url,
                "jwks_uri": self.jwks_uri or f"{self.url}/jwks",
            }
        if path == "/jwks":
            return self.jwks_status, self.jwks if self.jwks_status == 200 else {"error": "down"}
        return 404, {}

    def publish(self, keys: dict[str, PrivateKey], *kids: str) -> None:
        self.jwks = {"keys": [public_jwk(keys[kid], kid) for kid in kids]}

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def github(keys: dict[str, PrivateKey]) -> Iterator[StandInIssuer]:
    issuer = StandInIssuer()
    issuer.publish(keys, "rsa-1")
    yield issuer
    issuer.close()


@pytest.fixture
def gitlab(keys: dict[str, PrivateKey]) -> Iterator[StandInIssuer]:
    issuer = StandInIssuer()
    issuer.publish(keys, "ec-1")
    yield issuer
    issuer.close()


Sign = Callable[..., str]


def github_rule(issuer: StandInIssuer, **fields: object) -> dict[str, object]:
    """What an operator writes for GitHub Actions (found by discovery)."""
    return {
        "issuer": issuer.url,
        "audience": AUDIENCE,
        "owner": "github:{repository}",
        "claims": {"repository_owner": "myorg", "ref": ["refs/heads/main", "refs/tags/v*"]},
        "allow_hosts": [f"127.0.0.1:{issuer.port}"],
    } | fields


def gitlab_rule(issuer: StandInIssuer) -> dict[str, object]:
    """What an operator writes for GitLab CI, its JWKS named rather than discovered."""
    return {
        "issuer": issuer.url,
        "audience": AUDIENCE,
        "owner": "gitlab:{project_path}",
        "claims": {"namespace_path": "mygroup"},
        "jwks_url": f"{issuer.url}/jwks",
        "allow_hosts": ["127.0.0.1"],
    }


def app_with(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *rules: dict[str, object]
) -> TestClient:
    # As an operator configures them: environment variables.
    monkeypatch.setenv("BISECT_OIDC_ISSUERS", json.dumps(list(rules)))
    monkeypatch.setenv("BISECT_API_TOKENS", f"alice:{STATIC}")
    monkeypatch.setenv("BISECT_RUNNER_TOKENS", "runner-secret")
    return TestClient(create_app(settings(tmp_path)))


@pytest.fixture
def client(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    uv_cache: Path,
    github: StandInIssuer,
    gitlab: StandInIssuer,
) -> Iterator[TestClient]:
    monkeypatch.setenv("UV_CACHE_DIR", str(uv_cache))
    with app_with(tmp_path, monkeypatch, github_rule(github), gitlab_rule(gitlab)) as client:
        yield client


def signer(keys: dict[str, PrivateKey], issuer: StandInIssuer) -> Sign:
    """GitHub-like tokens of `issuer`: claims as GitHub's, overridden by `claims` (None
    drops one), signed with `keys[key or kid]`."""

    def make(kid: str = "rsa-1", key: str | None = None, alg: str = "RS256", **claims: Any) -> str:
        now = int(time.time())
        body = {
            "iss": issuer.url,
            "aud": AUDIENCE,
            "iat": now,
            "nbf": now,
            "exp": now + 300,
            "sub": "repo:myorg/app:ref:refs/heads/main",
            "repository": "myorg/app",
            "repository_owner": "myorg",
            "ref": "refs/heads/main",
        } | claims
        body = {k: v for k, v in body.items() if v is not None}
        headers = {"kid": kid} if kid else {}
        return jwt.encode(body, keys[key or kid], algorithm=alg, headers=headers)

    return make


@pytest.fixture
def sign(keys: dict[str, PrivateKey], github: StandInIssuer) -> Sign:
    return signer(keys, github)


def refused(client: TestClient, token: str) -> tuple[int, str]:
    response = client.get(f"{API}/jobs", headers=bearer(token))
    return response.status_code, response.json()["detail"]


def test_a_stand_in_github_token_submits_jobs_its_repository_alone_reads(
    client: TestClient, sign: Sign, github: StandInIssuer, fixture_index: str
) -> None:
    app_token = sign()
    created = client.post(f"{API}/jobs", json=job_body(fixture_index), headers=bearer(app_token))
    assert created.status_code == 201, created.text
    job_id = created.json()["id"]
    assert client.get(f"{API}/jobs/{job_id}", headers=bearer(app_token)).status_code == 200
    listed = client.get(f"{API}/jobs", headers=bearer(app_token)).json()["items"]
    assert [(job["id"], job["owner"]) for job in listed] == [(job_id, "github:myorg/app")]
    # Another repository of the same organisation is another owner; so is a client token.
    for other in (sign(repository="myorg/other"), STATIC):
        assert client.get(f"{API}/jobs/{job_id}", headers=bearer(other)).status_code == 404
        assert client.get(f"{API}/jobs", headers=bearer(other)).json()["items"] == []
    # A tag matches the ref rule's second glob; the token is a client, never a runner.
    assert client.get(f"{API}/jobs", headers=bearer(sign(ref="refs/tags/v1.2"))).status_code == 200
    runner = client.post(f"{API}/runners", json={"name": "r"}, headers=bearer(app_token))
    assert (runner.status_code, runner.json()["detail"]) == (
        403,
        "an API token cannot be used on runner endpoints",
    )
    # Discovery and JWKS were fetched once for all of these requests.
    assert github.hits == {"/.well-known/openid-configuration": 1, "/jwks": 1}


def test_a_stand_in_gitlab_token_signed_with_ec_uses_the_named_jwks(
    client: TestClient, keys: dict[str, PrivateKey], gitlab: StandInIssuer, fixture_index: str
) -> None:
    now = int(time.time())
    claims = {
        "iss": gitlab.url,
        "aud": AUDIENCE,
        "iat": now,
        "exp": now + 300,
        "namespace_path": "mygroup",
        "project_path": "mygroup/proj",
        "ref_protected": "true",
    }
    token = jwt.encode(claims, keys["ec-1"], algorithm="ES256", headers={"kid": "ec-1"})
    created = client.post(f"{API}/jobs", json=job_body(fixture_index), headers=bearer(token))
    assert created.status_code == 201, created.text
    listed = client.get(f"{API}/jobs", headers=bearer(token)).json()["items"]
    assert [job["owner"] for job in listed] == ["gitlab:mygroup/proj"]
    assert gitlab.hits == {"/jwks": 1}  # named: no discovery


def _iso(value: int) -> str:
    return datetime.fromtimestamp(value, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


ALGS = "RS256, RS384, RS512, PS256, PS384, PS512, ES256, ES384, ES512"
# Each case: the token (from `sign` and the issuer's URL) and the one line it is refused with.
Case = Callable[[Sign, str, int], tuple[str, str]]
REFUSALS: dict[str, Case] = {
    "expired": lambda sign, url, now: (
        sign(exp=now - 3600, iat=now - 3900, nbf=now - 3900),
        f"OIDC token: expired at {_iso(now - 3600)}",
    ),
    "not yet valid": lambda sign, url, now: (
        sign(nbf=now + 3600),
        f"OIDC token: not valid before {_iso(now + 3600)}",
    ),
    "issued in the future": lambda sign, url, now: (
        sign(iat=now + 3600, nbf=None, exp=now + 7200),
        f"OIDC token: issued in the future ({_iso(now + 3600)})",
    ),
    "wrong audience": lambda sign, url, now: (
        sign(aud="https://elsewhere.test"),
        f"OIDC token: audience 'https://elsewhere.test' is not this service's ('{AUDIENCE}')",
    ),
    "unknown issuer": lambda sign, url, now: (
        sign(iss="https://token.actions.example"),
        "OIDC token: issuer 'https://token.actions.example' is not trusted "
        "(not in BISECT_OIDC_ISSUERS)",
    ),
    "wrong key": lambda sign, url, now: (
        sign(key="stranger"),
        f"OIDC token: bad signature (not made by key 'rsa-1' of {url})",
    ),
    "key not in the JWKS": lambda sign, url, now: (
        sign(kid="stranger"),
        f"OIDC token: key 'stranger' is not in the JWKS of {url}",
    ),
    "no kid": lambda sign, url, now: (
        sign(kid="", key="rsa-1"),
        "OIDC token: its header names no key (kid)",
    ),
    "HS256": lambda sign, url, now: (
        jwt.encode({"iss": url}, "a-shared-secret-of-32-bytes-or-more", algorithm="HS256"),
        f"OIDC token: algorithm 'HS256' is not accepted (only {ALGS})",
    ),
    "alg none": lambda sign, url, now: (
        jwt.encode({"iss": url}, None, algorithm="none"),
        f"OIDC token: algorithm 'none' is not accepted (only {ALGS})",
    ),
    "key of another algorithm": lambda sign, url, now: (
        sign(kid="rsa-1", key="ec-1", alg="ES256"),
        f"OIDC token: key 'rsa-1' of {url} is for 'RS256', not ES256",
    ),
    "no exp": lambda sign, url, now: (sign(exp=None), "OIDC token: missing claim 'exp'"),
    "no aud": lambda sign, url, now: (sign(aud=None), "OIDC token: missing claim 'aud'"),
    "no rule claim": lambda sign, url, now: (
        sign(repository_owner=None),
        f"OIDC token: missing claim 'repository_owner' (required for {url} by BISECT_OIDC_ISSUERS)",
    ),
    "rule not met": lambda sign, url, now: (
        sign(repository_owner="evilorg", repository="evilorg/app"),
        "OIDC token: claim repository_owner 'evilorg' does not match 'myorg'",
    ),
    "glob not met": lambda sign, url, now: (
        sign(ref="refs/heads/feature"),
        "OIDC token: claim ref 'refs/heads/feature' does not match any of "
        "'refs/heads/main', 'refs/tags/v*'",
    ),
    "claim no string": lambda sign, url, now: (
        sign(ref=["refs/heads/main"]),
        "OIDC token: claim 'ref' is no string, number or boolean",
    ),
    "no owner name": lambda sign, url, now: (
        sign(repository="myorg/a b"),
        "OIDC token: owner 'github:myorg/a b' made by 'github:{repository}' is no owner "
        "name (letters, digits, _ . - : / @; at most 128)",
    ),
    "not a JWT": lambda sign, url, now: ("not.a.jwt", "invalid bearer token"),
}


@pytest.fixture(scope="module")
def refusing(
    keys: dict[str, PrivateKey], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[TestClient, StandInIssuer]]:
    """One app and issuer for every refusal (none of them changes either)."""
    issuer = StandInIssuer()
    issuer.publish(keys, "rsa-1")
    configured = settings(
        tmp_path_factory.mktemp("refusals"),
        oidc_issuers=json.dumps([github_rule(issuer)]),
        api_tokens=f"alice:{STATIC}",
    )
    with TestClient(create_app(configured)) as client:
        yield client, issuer
    issuer.close()


@pytest.mark.parametrize("case", REFUSALS)
def test_each_refusal_is_a_401_with_one_line_and_no_token(
    refusing: tuple[TestClient, StandInIssuer],
    keys: dict[str, PrivateKey],
    caplog: pytest.LogCaptureFixture,
    case: str,
) -> None:
    client, issuer = refusing
    caplog.set_level(logging.INFO)
    token, line = REFUSALS[case](signer(keys, issuer), issuer.url, int(time.time()))
    for response in (
        client.get(f"{API}/jobs", headers=bearer(token)),
        client.post(f"{API}/jobs", json={}, headers=bearer(token)),  # before the body
    ):
        assert (response.status_code, response.json()) == (401, {"detail": line})
        assert response.headers["www-authenticate"] == "Bearer"
    assert line in caplog.text  # the operator sees why
    assert token not in caplog.text


def test_a_rotated_key_is_fetched_once_and_unknown_kids_fetch_no_more(
    client: TestClient, keys: dict[str, PrivateKey], sign: Sign, github: StandInIssuer
) -> None:
    assert client.get(f"{API}/jobs", headers=bearer(sign())).status_code == 200
    assert github.hits["/jwks"] == 1
    github.publish(keys, "rsa-2")  # the issuer rotates: rsa-1 is gone
    assert client.get(f"{API}/jobs", headers=bearer(sign(kid="rsa-2"))).status_code == 200
    assert github.hits["/jwks"] == 2
    # Another unknown kid soon after: no fetch (random kids cannot make the server fetch).
    github.publish(keys, "rsa-2", "stranger")
    assert refused(client, sign(kid="stranger")) == (
        401,
        f"OIDC token: key 'stranger' is not in the JWKS of {github.url}",
    )
    assert refused(client, sign()) == (
        401,
        f"OIDC token: key 'rsa-1' is not in the JWKS of {github.url}",
    )
    assert github.hits["/jwks"] == 2
    assert github.hits["/.well-known/openid-configuration"] == 2


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_a_jwks_out_of_reach_is_503_and_not_asked_again_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sign: Sign, github: StandInIssuer
) -> None:
    github.jwks_status = 500
    with app_with(tmp_path, monkeypatch, github_rule(github)) as client:
        line = f"cannot check OIDC tokens of {github.url} now: JWKS {github.url}/jwks: answered 500"
        assert refused(client, sign()) == (503, line)
        github.jwks_status = 200  # back, but the next try waits for RETRY_S
        assert refused(client, sign()) == (503, line)
        assert github.hits["/jwks"] == 1
    port = _closed_port()
    rule = github_rule(github, jwks_url=f"http://127.0.0.1:{port}/jwks", allow_hosts=["127.0.0.1"])
    with app_with(tmp_path, monkeypatch, rule) as client:
        assert refused(client, sign()) == (
            503,
            f"cannot check OIDC tokens of {github.url} now: JWKS http://127.0.0.1:{port}/jwks: "
            "connection refused",
        )


@pytest.mark.parametrize(
    ("jwks_uri", "named_issuer", "reason"),
    [
        (
            "http://10.255.255.1/jwks",
            None,
            "JWKS http://10.255.255.1/jwks: plain http is fetched only from a host listed in "
            "allow_hosts",
        ),
        (
            "https://10.255.255.1/jwks",
            None,
            "JWKS https://10.255.255.1/jwks: host 10.255.255.1 is not a public address "
            "(list it in allow_hosts of BISECT_OIDC_ISSUERS)",
        ),
        (
            None,
            "https://other.test",
            "discovery {url}/.well-known/openid-configuration: names issuer 'https://other.test'",
        ),
    ],
)
def test_a_discovered_jwks_elsewhere_is_refused_before_any_connection(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    sign: Sign,
    github: StandInIssuer,
    jwks_uri: str | None,
    named_issuer: str | None,
    reason: str,
) -> None:
    # The discovery document is the issuer's word: where it points is checked like any
    # outbound URL (10.255.255.1 is private; a connection would hang, not be refused).
    github.jwks_uri, github.named_issuer = jwks_uri, named_issuer
    with app_with(tmp_path, monkeypatch, github_rule(github)) as client:
        assert refused(client, sign()) == (
            503,
            f"cannot check OIDC tokens of {github.url} now: {reason.format(url=github.url)}",
        )
    assert github.hits["/jwks"] == 0


def test_issuers_alone_close_the_service(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sign: Sign, github: StandInIssuer
) -> None:
    monkeypatch.setenv("BISECT_OIDC_ISSUERS", json.dumps([github_rule(github)]))
    configured = settings(tmp_path)
    assert configured.auth_enabled
    with TestClient(create_app(configured)) as client:
        # Closed: no token is 401 (and the open service's Host check no longer applies).
        response = client.get(f"{API}/jobs")
        assert (response.status_code, response.json()["detail"]) == (
            401,
            "missing bearer token (Authorization: Bearer TOKEN)",
        )
        assert client.get(f"{API}/jobs", headers=bearer(sign())).status_code == 200
        assert client.post(f"{API}/runners", json={"name": "r"}).status_code == 401


def test_configured_tokens_come_first_even_when_they_are_jwts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sign: Sign, github: StandInIssuer
) -> None:
    # A static token that is itself a JWT (and of a trusted issuer): the static one wins.
    as_static = sign(repository="myorg/elsewhere")
    monkeypatch.setenv("BISECT_OIDC_ISSUERS", json.dumps([github_rule(github)]))
    with TestClient(create_app(settings(tmp_path, api_tokens=f"bob:{as_static}"))) as client:
        created = client.post(f"{API}/jobs", json={}, headers=bearer(as_static))
        assert created.status_code == 422  # past auth: the body is what is wrong
        assert github.hits["/jwks"] == 0
    # With no issuer configured, a JWT is just a wrong token.
    monkeypatch.delenv("BISECT_OIDC_ISSUERS")
    with TestClient(create_app(settings(tmp_path, api_tokens="bob:x"))) as client:
        assert refused(client, sign()) == (401, "invalid bearer token")


GOOD = {
    "issuer": "https://token.actions.githubusercontent.com",
    "audience": AUDIENCE,
    "owner": "github:{repository}",
    "claims": {"repository_owner": "myorg"},
}


@pytest.mark.parametrize(
    ("value", "line"),
    [
        (
            "{not json",
            "BISECT_OIDC_ISSUERS: not JSON (Expecting property name enclosed in double quotes: "
            "line 1 column 2 (char 1)); a list of issuer objects, see the README",
        ),
        ("{}", "BISECT_OIDC_ISSUERS: a JSON list of issuer objects, see the README"),
        (
            [GOOD, GOOD],
            "BISECT_OIDC_ISSUERS: issuer https://token.actions.githubusercontent.com is listed "
            "twice; one entry per issuer",
        ),
        (
            [GOOD | {"audience": None}],
            "BISECT_OIDC_ISSUERS[0].audience: Input should be a valid string",
        ),
        (
            [{k: v for k, v in GOOD.items() if k != "claims"}],
            "BISECT_OIDC_ISSUERS[0].claims: Field required",
        ),
        (
            [GOOD | {"audiences": "x"}],
            "BISECT_OIDC_ISSUERS[0].audiences: Extra inputs are not permitted",
        ),
        (
            [GOOD | {"claims": {}}],
            "BISECT_OIDC_ISSUERS[0].claims: at least one rule (e.g. repository_owner): with "
            "none, any job of the issuer would be let in, every user's of a shared forge",
        ),
        (
            [GOOD | {"owner": "github:{repository.__class__}"}],
            "BISECT_OIDC_ISSUERS[0].owner: owner 'github:{repository.__class__}': only {claim} "
            "placeholders are filled in",
        ),
        (
            [GOOD | {"jwks_url": "http://127.0.0.1:9/jwks"}],
            "BISECT_OIDC_ISSUERS[0]: issuer https://token.actions.githubusercontent.com: "
            "http://127.0.0.1:9/jwks: plain http is fetched only from a host listed in allow_hosts",
        ),
        (
            [GOOD | {"issuer": "http://gitlab.internal"}],
            "BISECT_OIDC_ISSUERS[0]: issuer http://gitlab.internal: "
            "http://gitlab.internal/.well-known/openid-configuration: plain http is fetched only "
            "from a host listed in allow_hosts",
        ),
    ],
)
def test_the_issuers_setting_is_refused_in_one_line(
    monkeypatch: pytest.MonkeyPatch, value: object, line: str
) -> None:
    monkeypatch.setenv(
        "BISECT_OIDC_ISSUERS", value if isinstance(value, str) else json.dumps(value)
    )
    get_settings.cache_clear()
    try:
        with pytest.raises(InvalidInput) as raised:
            get_settings()
        assert str(raised.value) == line
    finally:
        get_settings.cache_clear()


def test_a_listed_http_issuer_and_a_good_one_are_taken(monkeypatch: pytest.MonkeyPatch) -> None:
    internal = GOOD | {"issuer": "http://gitlab.internal", "allow_hosts": ["GitLab.internal"]}
    monkeypatch.setenv("BISECT_OIDC_ISSUERS", json.dumps([GOOD, internal]))
    get_settings.cache_clear()
    try:
        issuers = get_settings().oidc_issuers
    finally:
        get_settings.cache_clear()
    assert [(i.issuer, i.allow_hosts, i.claims) for i in issuers] == [
        (GOOD["issuer"], (), {"repository_owner": "myorg"}),
        ("http://gitlab.internal", ("gitlab.internal",), {"repository_owner": "myorg"}),
    ]


def test_the_readmes_example_is_a_setting_the_server_takes(monkeypatch: pytest.MonkeyPatch) -> None:
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    block = readme.split("<!-- oidc-example -->\n```sh\n", 1)[1].split("```", 1)[0]
    value = block.strip().removeprefix("BISECT_OIDC_ISSUERS='").removesuffix("'")
    monkeypatch.setenv("BISECT_OIDC_ISSUERS", value)
    get_settings.cache_clear()
    try:
        issuers = get_settings().oidc_issuers
    finally:
        get_settings.cache_clear()
    assert [(i.issuer, i.owner, i.jwks_url) for i in issuers] == [
        ("https://token.actions.githubusercontent.com", "github:{repository}", None),
        ("https://gitlab.com", "gitlab:{project_path}", None),
    ]
