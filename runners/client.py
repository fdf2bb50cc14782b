"""The HTTP client of the leakbisect API (`docs/api.md`), used by the CLI and the runners.

Transport rules:

* Explicit timeouts (connect 5 s, read/write 30 s, pool 5 s); a long-polling
  lease gets its wait added to the read timeout.
* Network errors (connect refused, timeouts, a dropped connection) and 5xx
  answers are retried with exponential backoff (``backoff * 2**n`` seconds,
  capped at 10 s), ``retries`` times; then `ApiUnreachable` (network) or
  `ApiError` (the last 5xx) is raised.
* 4xx answers are never retried: `ApiError(status, detail)`, whose ``str`` is
  one line, ``HTTP 422: range: version 9.9 ... does not exist``. A 409 is the
  subclass `StaleLeaseError` (the lease was lost or the job cancelled: the
  runner must kill its trial).

Retrying a POST whose answer was lost may repeat it on the server. `submit`
sends an ``Idempotency-Key`` (one per call, the same on every retry), so the
server answers a repeat with the job the first request created; a repeated
`lease` only holds a lease that then expires; the lease rules make the other
runner-side repeats harmless.

Runners: `register` keeps the runner secret the server returns and sends it as
``X-Runner-Secret`` on every later runner request (`runner_secret` presets one,
for a runner resuming an identity it stored).

The token and the runner secret appear in no message, log line or ``repr``.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from typing import Any

import httpx
from pydantic import BaseModel

from contract.wire import (
    API_PREFIX,
    IDEMPOTENCY_HEADER,
    RUNNER_SECRET_HEADER,
    Heartbeat,
    HeartbeatAck,
    Lease,
    LeaseReturn,
    RunnerRegister,
    RunnerRegistered,
    TrialReport,
)

DEFAULT_TIMEOUT = httpx.Timeout(connect=5.0, read=30.0, write=30.0, pool=5.0)
MAX_BACKOFF_S = 10.0

# Worth another try: nothing (or nothing complete) came back.
RETRYABLE = (
    httpx.ConnectError,
    httpx.ConnectTimeout,
    httpx.ReadTimeout,
    httpx.WriteTimeout,
    httpx.PoolTimeout,
    httpx.ReadError,
    httpx.WriteError,
    httpx.RemoteProtocolError,
)


class ApiError(Exception):
    """The API answered with an error status; ``str`` is one line."""

    def __init__(self, status: int, detail: str):
        super().__init__(status, detail)
        self.status = status
        self.detail = detail

    def __str__(self) -> str:
        return f"HTTP {self.status}: {self.detail}"


class StaleLeaseError(ApiError):
    """409: the trial was re-leased, finished or cancelled; stop working on it."""


class ApiUnreachable(Exception):
    """No answer from the server after every retry; ``str`` is one line."""

    def __init__(self, url: str, reason: str):
        super().__init__(url, reason)
        self.url = url
        self.reason = reason

    def __str__(self) -> str:
        return f"cannot reach {self.url}: {self.reason}"


def api_root(base_url: str) -> str:
    """``http://host:8000`` or ``http://host:8000/api/v1`` -> the latter, no trailing slash."""
    url = base_url.strip().rstrip("/")
    if "://" not in url:
        url = f"http://{url}"
    if not url.endswith(API_PREFIX):
        url += API_PREFIX
    return url


def _one_line(text: str, limit: int = 300) -> str:
    line = " ".join(text.split())
    return line if len(line) <= limit else line[: limit - 3] + "..."


def _detail(response: httpx.Response) -> str:
    """The server's message: ``{"detail": ...}`` as one line, else the body or the reason."""
    try:
        body = response.json()
    except ValueError:
        body = None
    detail: Any = body.get("detail") if isinstance(body, dict) else None
    if isinstance(detail, list) and detail and isinstance(detail[0], dict):
        # FastAPI's own validation errors: [{"loc": [...], "msg": ...}, ...]
        first = detail[0]
        loc = [str(p) for p in first.get("loc", []) if p not in ("body", "query", "path")]
        msg = str(first.get("msg", "invalid"))
        detail = f"{'.'.join(loc)}: {msg}" if loc else msg
    if detail is None:
        detail = response.text or response.reason_phrase or "no detail"
    return _one_line(str(detail))


def _reason(exc: httpx.HTTPError) -> str:
    text = str(exc).strip()
    return _one_line(f"{type(exc).__name__}: {text}" if text else type(exc).__name__)


class ApiClient:
    """One method per endpoint of `docs/api.md`; JSON in, dicts or wire models out."""

    def __init__(
        self,
        base_url: str,
        token: str | None = None,
        *,
        timeout: httpx.Timeout = DEFAULT_TIMEOUT,
        retries: int = 5,
        backoff: float = 0.5,
        transport: httpx.BaseTransport | None = None,
        sleep: Callable[[float], None] = time.sleep,
        on_retry: Callable[[str], None] | None = None,
        runner_secret: str | None = None,
    ):
        self.base_url = api_root(base_url)
        self.runner_secret = runner_secret
        self.timeout = timeout
        self.retries = retries
        self.backoff = backoff
        self._sleep = sleep
        self._on_retry = on_retry
        headers = {"User-Agent": "leakbisect"}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        self._http = httpx.Client(
            base_url=self.base_url, headers=headers, timeout=timeout, transport=transport
        )

    def __repr__(self) -> str:  # never the token
        return f"ApiClient({self.base_url!r})"

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> ApiClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- transport

    def url(self, path: str) -> str:
        return f"{self.base_url}{path}"

    def request(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        params: dict[str, Any] | None = None,
        timeout: httpx.Timeout | None = None,
        headers: dict[str, str] | None = None,
        retries: int | None = None,
    ) -> httpx.Response:
        """Send with retries (the same request, headers included, every time); a 2xx
        response, else `ApiError` / `ApiUnreachable`."""
        if isinstance(json, BaseModel):
            json = json.model_dump(mode="json")
        if params:
            params = {k: v for k, v in params.items() if v is not None}
        if method != "GET" and json is None:
            # The API takes JSON only on what changes state, a bodyless POST included
            # (its CSRF rule: service/http/guard.py).
            headers = {"Content-Type": "application/json", **(headers or {})}
        retries = self.retries if retries is None else retries
        attempt = 0
        while True:
            try:
                response = self._http.request(
                    method,
                    path,
                    json=json,
                    params=params,
                    headers=headers,
                    timeout=timeout or self.timeout,
                )
            except RETRYABLE as exc:
                if attempt >= retries:
                    raise ApiUnreachable(self.url(path), _reason(exc)) from None
                self._wait(attempt, f"{method} {path}: {_reason(exc)}")
                attempt += 1
                continue
            except httpx.HTTPError as exc:  # bad URL, unsupported protocol...: not worth retrying
                raise ApiUnreachable(self.url(path), _reason(exc)) from None
            if response.status_code >= 500:
                if attempt >= retries:
                    raise ApiError(response.status_code, _detail(response))
                self._wait(attempt, f"{method} {path}: HTTP {response.status_code}")
                attempt += 1
                continue
            if response.status_code == 409:
                raise StaleLeaseError(409, _detail(response))
            if response.status_code >= 400:
                raise ApiError(response.status_code, _detail(response))
            return response

    def _wait(self, attempt: int, what: str) -> None:
        delay = min(MAX_BACKOFF_S, self.backoff * 2**attempt)
        if self._on_retry is not None:
            self._on_retry(f"{what}; retrying in {delay:.1f}s")
        self._sleep(delay)

    def _json(self, method: str, path: str, **kw: Any) -> Any:
        response = self.request(method, path, **kw)
        return response.json() if response.content else None

    # -- clients

    def submit(
        self, request: BaseModel | dict[str, Any], idempotency_key: str | None = None
    ) -> dict[str, Any]:
        """``POST /jobs`` -> ``{"id", "url", "status"}``. Every retry sends the same
        ``Idempotency-Key`` (a new one per call unless given), so a request whose answer was
        lost creates one job: the server answers the repeat with it (200, not 201)."""
        key = idempotency_key or uuid.uuid4().hex
        return self._json("POST", "/jobs", json=request, headers={IDEMPOTENCY_HEADER: key})

    def list_jobs(
        self,
        status: str | None = None,
        package: str | None = None,
        limit: int = 50,
        offset: int = 0,
    ) -> dict[str, Any]:
        params = {"status": status, "package": package, "limit": limit, "offset": offset}
        return self._json("GET", "/jobs", params=params)

    def get_job(self, job_id: int) -> dict[str, Any]:
        return self._json("GET", f"/jobs/{job_id}")

    def cancel(self, job_id: int) -> dict[str, Any]:
        return self._json("POST", f"/jobs/{job_id}/cancel")

    def get_trial(self, trial_id: int) -> dict[str, Any]:
        return self._json("GET", f"/trials/{trial_id}")

    def get_job_trial(self, job_id: int, number: int) -> dict[str, Any]:
        return self._json("GET", f"/jobs/{job_id}/trials/{number}")

    def get_samples(
        self,
        trial_id: int,
        *,
        offset: int = 0,
        limit: int | None = None,
        max_points: int | None = None,
    ) -> dict[str, Any]:
        params = {"offset": offset or None, "limit": limit, "max_points": max_points}
        return self._json("GET", f"/trials/{trial_id}/samples", params=params)

    # -- runners

    def _runner(self, secret: str | None = None) -> dict[str, str]:
        secret = secret or self.runner_secret
        return {RUNNER_SECRET_HEADER: secret} if secret else {}

    def register(self, registration: RunnerRegister) -> RunnerRegistered:
        """Join; keeps the returned secret for this client's later runner requests."""
        registered = RunnerRegistered.model_validate(
            self._json("POST", "/runners", json=registration)
        )
        self.runner_secret = registered.runner_secret
        return registered

    def lease(self, runner_id: str, wait: float = 20.0) -> Lease | None:
        """Long-poll for a trial: a `Lease`, or None when no work came within ``wait``."""
        timeout = httpx.Timeout(
            connect=self.timeout.connect,
            read=(self.timeout.read or 30.0) + wait,
            write=self.timeout.write,
            pool=self.timeout.pool,
        )
        response = self.request(
            "POST",
            f"/runners/{runner_id}/lease",
            params={"wait": wait},
            timeout=timeout,
            headers=self._runner(),
        )
        if response.status_code == 204 or not response.content:
            return None
        return Lease.model_validate(response.json())

    def heartbeat(self, trial_id: int, beat: Heartbeat) -> HeartbeatAck:
        """Extend the lease; `StaleLeaseError` means: kill the trial."""
        return HeartbeatAck.model_validate(
            self._json(
                "POST", f"/trials/{trial_id}/heartbeat", json=beat, headers=self._runner()
            )
        )

    def complete(
        self,
        trial_id: int,
        report: TrialReport,
        secret: str | None = None,
        retries: int | None = None,
    ) -> dict[str, Any]:
        """Upload the result (with ``runner_id`` and ``attempt``) -> ``{"verdict"}``;
        `secret`: that runner's, when it is not this client's (a spooled report);
        `retries`: instead of the client's own (the agent retries a spooled report itself)."""
        path = f"/trials/{trial_id}/complete"
        headers = self._runner(secret)
        return self._json("POST", path, json=report, headers=headers, retries=retries)

    def give_back(self, trial_id: int, lease_return: LeaseReturn) -> None:
        """Return an unfinished trial to the queue without using up an attempt."""
        path = f"/trials/{trial_id}/return"
        self.request("POST", path, json=lease_return, headers=self._runner())

    def leave(self, runner_id: str) -> None:
        self.request("DELETE", f"/runners/{runner_id}", headers=self._runner())
