"""No request makes the service answer 5xx (issue 26, row 7 and Deliver 7).

First the review's inputs that once answered 500, each now a 422 with one line. Then a
property-based fuzz (Hypothesis, a fixed seed: `derandomize=True`, and a budget of
examples that keeps this module near a minute on two cores) through FastAPI's TestClient
against `create_app` on a SQLite database in tmp:

- bodies of the job submission, the runner's registration, report, heartbeat and return,
  drawn from the app's own OpenAPI schema (`from_schema`: every field shaped as declared,
  with values at and past its bounds) with hostile values mixed in at every level (NaN,
  Infinity, 2^63, 1e30, huge strings, deep nesting, wrong types: `HOSTILE`);
- raw bodies that are not JSON objects at all (truncated, 5000 deep, 5000-digit numbers);
- the query and path parameters of every listing and page, API and HTML.

Every answer must be below 500. Traffic stays on loopback: a job's index is the fixture's
loopback index, and every other URL a body names is one the service refuses before any
connection (`URLS`); no default index (PyPI) is ever used.
"""

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from service.app import create_app
from service.settings import Settings

API = "/api/v1"
JSON = {"Content-Type": "application/json"}
BIG = "1" + "0" * 20  # 1e20 written out: a query integer past 64 bits

# ------------------------------------------------------------------ the review's inputs

REVIEW_GETS: list[tuple[str, str]] = [
    (f"/?page={BIG}", "page: Input should be less than or equal to"),
    (f"/fragments/jobs?page={BIG}", "page: Input should be less than or equal to"),
    (f"{API}/jobs?offset={BIG}", "offset: Input should be less than or equal to"),
    (f"{API}/jobs?offset=-1", "offset: Input should be greater than or equal to 0"),
    (f"{API}/trials/1/samples?offset={BIG}", "offset: Input should be less than or equal to"),
]


def make_settings(tmp: Path) -> Settings:
    return Settings(
        database_url=f"sqlite:///{tmp / 'fuzz.db'}",
        data_dir=tmp,
        cache_dir=tmp / "cache",
        reap_interval_s=0,
        trusted_hosts=["testserver"],
        allowed_indexes=["127.0.0.1"],  # the fixture's index; every other host is refused
    )


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    app = create_app(make_settings(tmp_path_factory.mktemp("fuzz")))
    with TestClient(app, raise_server_exceptions=False) as client:
        yield client


@pytest.mark.parametrize(("url", "detail"), REVIEW_GETS)
def test_the_reviews_listings_are_422(client: TestClient, url: str, detail: str) -> None:
    answer = client.get(url)
    assert answer.status_code == 422 and answer.json()["detail"].startswith(detail), answer.text


def test_a_400_digit_memory_limit_is_422(client: TestClient) -> None:
    body = {"package": "p", "range": "1..2", "script": "pass", "memory_limit": "9" * 400}
    answer = client.post(f"{API}/jobs", json=body)
    detail = "memory_limit: '99999999999999999999'... (400 characters) is too large for a size"
    assert (answer.status_code, answer.json()) == (422, {"detail": detail})


def test_runner_paths_past_64_bits_are_422(client: TestClient) -> None:
    runner = client.post(f"{API}/runners", json={"name": "r"}).json()
    headers = {**JSON, "X-Runner-Secret": runner["runner_secret"]}
    beat = {"runner_id": runner["runner_id"], "attempt": 1}
    for path in ("heartbeat", "return"):
        answer = client.post(f"{API}/trials/{BIG}/{path}", json=beat, headers=headers)
        assert (answer.status_code, answer.json()) == (
            422,
            {"detail": "trial_id: Input should be less than or equal to 9223372036854775807"},
        )
    lease = client.post(f"{API}/runners/{runner['runner_id']}/lease?wait=nan", headers=headers)
    assert (lease.status_code, lease.json()) == (
        422,
        {"detail": "wait: Input should be a finite number"},
    )


# ------------------------------------------------------------------ strategies

# The app's own schema: the bodies below are drawn from its models.
SPEC = create_app(Settings(database_url="sqlite://"), migrate=False).openapi()

# URLs a body may name: the fixture's index is put in at send time ("INDEX"); the others
# are refused before any connection is tried (not http(s), not a URL, or not allowed).
URLS = st.sampled_from(
    ["INDEX", "http://[::1", "file:///etc", "ftp://127.0.0.1/", "javascript:alert(1)", "\n", ""]
)
URL_FIELDS = {"index_url", "extra_index_urls", "find_links", "repo"}

SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.sampled_from([2**63, -(2**63) - 1, 2**64, 10**30, -1, 0]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([float("inf"), float("-inf"), float("nan"), 1e30, -1e30, 1e308]),
    st.text(max_size=50),
    st.sampled_from(["", "\x00", "9" * 400, "x" * 70_000, "é" * 5000, "1e20", "NaN"]),
)
# Any JSON: nested lists and objects of the scalars above.
ANY_JSON = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner),
    max_leaves=12,
)
DEEP = {"a": None}
for _ in range(300):
    DEEP = {"a": [DEEP]}
FINITE_JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**63 - 1)
    | st.text(max_size=20)
    | st.floats(allow_nan=False, allow_infinity=False),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner),
    max_leaves=12,
)
# The review's values, tried on one field of an otherwise valid body.
TARGETED = st.sampled_from(
    [float("inf"), float("nan"), -1e30, 2**63, 10**30, -1, "x" * 70_000, [None] * 6000, True]
)
HOSTILE = st.one_of(SCALARS, ANY_JSON, st.just(DEEP), st.just(["x"] * 30_000))


def from_schema(schema: dict[str, Any], clean: bool, depth: int = 0) -> Any:
    """A strategy for JSON shaped by the OpenAPI `schema` (types, enums, required fields).
    `clean`: every value within its declared bounds (at them, often), which the service
    takes and stores; else values also just past the bounds, and at any level sometimes a
    `HOSTILE` value instead (one in four)."""
    shaped = _shaped(schema, clean, depth)
    return shaped if clean else st.one_of(shaped, shaped, HOSTILE)


def _number(schema: dict[str, Any], clean: bool) -> Any:
    low, high = schema.get("minimum"), schema.get("maximum")
    if not clean:
        return st.floats(allow_nan=True, allow_infinity=True)
    above = schema.get("exclusiveMinimum")
    return st.floats(
        min_value=above if low is None else low,
        max_value=high,
        exclude_min=above is not None,
        allow_nan=False,
        allow_infinity=False,
    )


def _integer(schema: dict[str, Any], clean: bool) -> Any:
    low, high = schema.get("minimum"), schema.get("maximum")
    # OpenAPI writes bounds as floats: 2^63 - 1 comes back as 2^63.
    low, high = (None if v is None else max(min(int(v), 2**63 - 1), -(2**63)) for v in (low, high))
    if clean:
        edges = [v for v in (low, high) if v is not None]
        return st.integers(low, high) | st.sampled_from(edges or [0])
    edges = [v + d for v in (low, high) if v is not None for d in (-1, 0, 1)]
    return st.integers() | st.sampled_from(edges or [0])


def _string(schema: dict[str, Any], clean: bool) -> Any:
    most = schema.get("maxLength", 30)
    return st.text(max_size=min(most, 30)) | st.just("x" * (most if clean else most + 1))


def _object(schema: dict[str, Any], clean: bool, depth: int) -> Any:
    props = {
        name: from_schema(sub, clean, depth + 1)
        for name, sub in schema.get("properties", {}).items()
    }
    if not props:  # a mapping: its values as `additionalProperties` says
        values = schema.get("additionalProperties", True)
        if isinstance(values, dict):
            inner = from_schema(values, clean, depth + 1)
        else:
            inner = FINITE_JSON if clean else ANY_JSON
        return st.dictionaries(st.text(max_size=12), inner, max_size=4)
    required = {name: props.pop(name) for name in schema.get("required", []) if name in props}
    if not clean or not props:
        return st.fixed_dictionaries(required, optional=props)
    # Valid bodies name a few optional fields, so that one unlucky field rarely spoils them.
    names = st.lists(st.sampled_from(sorted(props)), max_size=4, unique=True)
    return names.flatmap(
        lambda chosen: st.fixed_dictionaries(required | {k: props[k] for k in chosen})
    )


def _shaped(schema: dict[str, Any], clean: bool, depth: int) -> Any:
    if "$ref" in schema:
        schema = SPEC["components"]["schemas"][schema["$ref"].rsplit("/", 1)[1]]
    if depth > 4:
        return st.none() if clean else SCALARS
    if "anyOf" in schema or "oneOf" in schema:
        return st.one_of(
            *(_shaped(s, clean, depth) for s in schema.get("anyOf", schema.get("oneOf")))
        )
    if "enum" in schema:
        return st.sampled_from(schema["enum"])
    kind = schema.get("type")
    if kind == "object":
        return _object(schema, clean, depth)
    if kind == "array":
        if "prefixItems" in schema:
            return st.tuples(*(from_schema(s, clean, depth + 1) for s in schema["prefixItems"]))
        items = from_schema(schema.get("items", {}), clean, depth + 1)
        most = schema.get("maxItems", 4)
        return st.lists(items, max_size=min(most, 4) if clean else min(most + 1, 5))
    kinds = {"string": _string, "integer": _integer, "number": _number}
    if kind in kinds:
        return kinds[kind](schema, clean)
    if kind == "boolean":
        return st.booleans()
    if kind == "null":
        return st.none()
    return FINITE_JSON if clean else ANY_JSON


def _poisoned(body: Any) -> Any:
    """`body` with one of its fields hostile: everything else valid, so that field's check
    is the one that answers."""
    if not isinstance(body, dict) or not body:
        return st.just(body)
    bad = st.sampled_from(["targeted", "any"]).flatmap({"targeted": TARGETED, "any": HOSTILE}.get)
    return st.builds(lambda key, value: body | {key: value}, st.sampled_from(sorted(body)), bad)


def body_of(model: str) -> Any:
    """A body of `model`: valid (a third), valid but for one field, or hostile throughout."""
    schema = {"$ref": f"#/components/schemas/{model}"}
    clean = from_schema(schema, clean=True)
    modes = {
        "valid": clean,
        "one bad": clean.flatmap(_poisoned),
        "hostile": from_schema(schema, False),
    }
    return st.sampled_from(sorted(modes)).flatmap(modes.__getitem__)


# ------------------------------------------------------------------ the fuzz

# A fixed seed (derandomize: the same examples on every run, so CI never flakes on a new
# draw) and a budget of examples that keeps this module near 30 s on a loaded 2-core
# machine; BUDGET_BODIES for the runner's report and the job, whose checks go deepest.
BUDGET = settings(
    derandomize=True,
    database=None,
    deadline=None,
    max_examples=60,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
BUDGET_BODIES = settings(BUDGET, max_examples=150)


def dumps(value: Any) -> bytes:
    """JSON as a hostile client writes it: NaN and Infinity as Python's json writes them."""
    return json.dumps(value, allow_nan=True).encode()


def below_500(answer: Any, what: str) -> None:
    assert answer.status_code < 500, f"{what}: {answer.status_code} {answer.text[:300]}"


class Runner:
    """One registered runner and the lease it holds: a fuzzed report that is taken ends
    the lease, so the next example leases again (submitting a job when none is queued)."""

    def __init__(self, client: TestClient, index: str) -> None:
        self.client, self.index = client, index
        answer = client.post(f"{API}/runners", json={"name": "fuzz"}).json()
        self.id, self.secret = answer["runner_id"], answer["runner_secret"]
        self.held: dict[str, Any] | None = None

    @property
    def headers(self) -> dict[str, str]:
        return {**JSON, "X-Runner-Secret": self.secret}

    def lease(self) -> dict[str, Any]:
        if self.held is None:
            for _ in range(2):
                got = self.client.post(
                    f"{API}/runners/{self.id}/lease", params={"wait": 0}, headers=self.headers
                )
                below_500(got, "lease")
                if got.status_code == 200:
                    self.held = got.json()["trial"]
                    break
                job = {"package": "leakyfixture", "range": "1.0.0..1.0.9", "script": "pass"}
                made = self.client.post(f"{API}/jobs", json=job | {"index_url": self.index})
                assert made.status_code == 201, made.text
        assert self.held is not None
        return self.held

    def fill(self, value: Any) -> Any:
        """The live lease's ids where the body kept them ("LIVE"): deeper than a 403/409."""
        if not isinstance(value, dict):
            return value
        held = self.lease()
        live = {"runner_id": self.id, "trial_id": held["trial_id"], "attempt": held["attempt"]}
        return {k: live.get(k, v) if v == "LIVE" else v for k, v in value.items()}


@pytest.fixture(scope="module")
def runner(client: TestClient, fixture_index: str) -> Runner:
    return Runner(client, fixture_index)


LIVE_IDS = ("runner_id", "trial_id", "attempt")


def _live(body: Any, every: bool) -> Any:
    if not isinstance(body, dict):
        return body
    return body | {k: "LIVE" for k in LIVE_IDS if every or k not in body}


def live(model: str) -> Any:
    """A body of `model` whose missing ids (or, drawn, all of them) are the live lease's."""
    return st.builds(_live, body_of(model), st.sampled_from([True, True, True, False]))


@BUDGET_BODIES
@given(report=live("TrialReport"))
def test_runner_reports_never_5xx(runner: Runner, report: Any) -> None:
    body = runner.fill(report)
    trial = runner.lease()["trial_id"]
    answer = runner.client.post(
        f"{API}/trials/{trial}/complete", content=dumps(body), headers=runner.headers
    )
    below_500(answer, "complete")
    if answer.status_code == 200:  # taken: the trial, its job and page still read
        runner.held = None
        below_500(runner.client.get(f"{API}/trials/{trial}"), "trial")
        job = runner.client.get(f"{API}/trials/{trial}").json()["job_id"]
        below_500(runner.client.get(f"{API}/jobs/{job}"), "job")
        below_500(runner.client.get(f"/jobs/{job}"), "job page")
        below_500(runner.client.get(f"{API}/jobs/{job}/report.md"), "report.md")


@BUDGET
@given(beat=live("Heartbeat"), back=live("LeaseReturn"), path=st.sampled_from(["h", "r"]))
def test_heartbeats_and_returns_never_5xx(runner: Runner, beat: Any, back: Any, path: str) -> None:
    trial = runner.lease()["trial_id"]
    kind, body = ("heartbeat", beat) if path == "h" else ("return", back)
    answer = runner.client.post(
        f"{API}/trials/{trial}/{kind}", content=dumps(runner.fill(body)), headers=runner.headers
    )
    below_500(answer, kind)
    if kind == "return" and answer.status_code == 200:
        runner.held = None


@BUDGET
@given(register=body_of("RunnerRegister"))
def test_registrations_never_5xx(client: TestClient, register: Any) -> None:
    below_500(client.post(f"{API}/runners", content=dumps(register), headers=JSON), "register")


# Free-text fields with their own grammar: a drawn string rarely parses, so a job of the
# fixture's package takes one of these instead (its other fields stay drawn).
PLAUSIBLE: dict[str, Any] = {
    "python": "3.12",
    "script_name": "repro.py",
    "resolve_at": "2024-01-01",
    "variables": {"LEAK_N": "1"},
    "from_env": "leakyfixture==1.0.0\n",
    "to_env": "leakyfixture==1.0.9\n",
    "base_env": "leakyfixture==1.0.0\n",
    "requirements": ["leakyfixture"],
}
RANGES = st.sampled_from(["1.0.0..1.0.9", "1.0.5..1.0.6", "1.0.9..1.0.0", "1.0.0..9.9", None])


@BUDGET_BODIES
@given(
    job=body_of("JobCreate"),
    urls=st.dictionaries(st.sampled_from(sorted(URL_FIELDS)), URLS, max_size=1),
    target=RANGES,
)
def test_job_submissions_never_5xx(
    client: TestClient, fixture_index: str, job: Any, urls: dict[str, str], target: str | None
) -> None:
    """A drawn job, often of the fixture's package (so its checks go past the index); its
    URLs only the loopback index or ones refused before connecting."""
    if isinstance(job, dict):
        if target is not None:
            job |= {"package": "leakyfixture", "range": target, "script": job.get("script") or "1"}
            if "from_env" in job or "to_env" in job:  # the pair, or neither
                job |= {"from_env": "", "to_env": ""}
            job |= {k: v for k, v in PLAUSIBLE.items() if k in job}
        job = {k: v for k, v in job.items() if k not in URL_FIELDS} | {"index_url": "INDEX"}
        for name, url in urls.items():
            job[name] = [url] if name in ("extra_index_urls", "find_links") else url
        job = {k: _index(v, fixture_index) for k, v in job.items()}
    answer = client.post(f"{API}/jobs", content=dumps(job), headers=JSON)
    below_500(answer, "submit")


def _index(value: Any, index: str) -> Any:
    if isinstance(value, list):
        return [index if v == "INDEX" else v for v in value]
    return index if value == "INDEX" else value


RAW_BODIES = [
    b"",
    b"{",
    b"[" * 5000 + b"]" * 5000,
    b'{"a":' * 5000 + b"1" + b"}" * 5000,
    b'{"package":' + b"9" * 5000 + b"}",
    b"\xff\xfe",
    b"null",
    b"[]",
    b'"x"',
    b"NaN",
]
RAW_PATHS = [
    f"{API}/jobs",
    f"{API}/runners",
    f"{API}/trials/1/heartbeat",
    f"{API}/trials/1/complete",
    f"{API}/trials/1/return",
    f"{API}/jobs/1/again",
]


@pytest.mark.parametrize("path", RAW_PATHS)
def test_bodies_that_are_not_objects_never_5xx(runner: Runner, path: str) -> None:
    for raw in RAW_BODIES:
        below_500(
            runner.client.post(path, content=raw, headers=runner.headers), f"{path} {raw[:10]!r}"
        )


QUERY = st.one_of(
    st.integers().map(str),
    st.sampled_from([BIG, "-" + BIG, "1e20", "nan", "inf", "-1", "0", "", "\x00", "9" * 400]),
    st.text(max_size=40),
    st.just("x" * 5000),
)
GETS = [
    (f"{API}/jobs", ["status", "package", "limit", "offset"]),
    (f"{API}/trials/{{id}}/samples", ["offset", "limit", "max_points"]),
    ("/", ["status", "package", "page"]),
    ("/fragments/jobs", ["status", "package", "page"]),
    ("/jobs/{id}", ["candidate"]),
    ("/fragments/jobs/{id}", ["candidate"]),
    ("/login", ["next"]),
]
PATHS = [
    f"{API}/jobs/{{id}}",
    f"{API}/jobs/{{id}}/trials/{{id}}",
    f"{API}/jobs/{{id}}/report.md",
    f"{API}/trials/{{id}}",
    "/jobs/{id}/report.md",
    "/jobs/{id}/trials/{id}/curve",
    "/jobs/{id}/cancel",
]


@BUDGET
@given(
    route=st.sampled_from(GETS),
    values=st.lists(QUERY, min_size=4, max_size=4),
    ident=st.one_of(st.sampled_from(["1", "2", "0", BIG, "-1"]), QUERY),
)
def test_listing_parameters_never_5xx(
    client: TestClient, route: tuple[str, list[str]], values: list[str], ident: str
) -> None:
    path, names = route
    url = path.replace("{id}", quote(ident, safe="") or "1")
    answer = client.get(url, params=dict(zip(names, values, strict=False)))
    below_500(answer, f"{path} {values}")


@BUDGET
@given(path=st.sampled_from(PATHS), ident=QUERY)
def test_path_ids_never_5xx(client: TestClient, path: str, ident: str) -> None:
    url = path.replace("{id}", quote(ident, safe="") or "1")
    below_500(client.get(url), f"{path} {ident[:40]!r}")
