"""Errors as HTTP answers, in one place: always `{"detail": "one line"}`.

- `LeakbisectError` kinds (contract/errors.py) map to statuses by `HTTP_STATUS`; a
  `field` is put in front of the message ("range: version 9.9 ... does not exist").
  The first matching row wins, so a kind comes before its base (`TooLarge` 413 before
  `LimitExceeded` 429); a limit's ``retry_after_s`` is sent as ``Retry-After``, and a 401
  (`Unauthenticated`) says ``WWW-Authenticate: Bearer``.
- Request validation errors are 422 with every error on one line, each naming its field
  ("memory_limit: '12X' is not a positive size ...; repeats: ...").
- Anything unexpected is logged with its traceback and answered 500 with the exception's
  type only (never its text: it may hold paths or SQL).
"""

import logging
from typing import Any

from fastapi import FastAPI, Request, status
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from contract.errors import (
    Conflict,
    Forbidden,
    InvalidInput,
    LeakbisectError,
    LimitExceeded,
    NotFound,
    TooLarge,
    Unauthenticated,
    Unavailable,
)

log = logging.getLogger(__name__)

HTTP_STATUS: dict[type[LeakbisectError], int] = {
    InvalidInput: status.HTTP_422_UNPROCESSABLE_CONTENT,
    NotFound: status.HTTP_404_NOT_FOUND,
    Unauthenticated: status.HTTP_401_UNAUTHORIZED,
    Conflict: status.HTTP_409_CONFLICT,
    Forbidden: status.HTTP_403_FORBIDDEN,
    Unavailable: status.HTTP_503_SERVICE_UNAVAILABLE,
    TooLarge: status.HTTP_413_CONTENT_TOO_LARGE,
    LimitExceeded: status.HTTP_429_TOO_MANY_REQUESTS,
}


def http_status(exc: LeakbisectError) -> int:
    for kind, code in HTTP_STATUS.items():
        if isinstance(exc, kind):
            return code
    return status.HTTP_500_INTERNAL_SERVER_ERROR


def _field(loc: tuple[Any, ...] | list[Any]) -> str:
    # Only the first element says where the value came from: a field may itself be named
    # `path` (an environment's `env.path`), and it must keep its name.
    where = ("body", "query", "path", "header", "cookie")
    parts = [str(p) for p in (loc[1:] if loc and loc[0] in where else loc)]
    return ".".join(parts) or (str(loc[0]) if loc else "request")


def _message(error: dict[str, Any]) -> str:
    if error.get("type") == "missing":
        return "field required"
    if error.get("type") == "json_invalid":
        reason = (error.get("ctx") or {}).get("error")
        return f"invalid JSON{f' ({reason})' if reason else ''}"
    msg = str(error.get("msg", "invalid"))
    for prefix in ("Value error, ", "Assertion failed, "):
        msg = msg.removeprefix(prefix)
    return msg.splitlines()[0] if msg else "invalid"


def validation_detail(exc: RequestValidationError) -> str:
    """All errors on one line: "field: message; other: message"."""
    parts = []
    for error in exc.errors():
        loc = error.get("loc", ())
        field = "body" if error.get("type") == "json_invalid" else _field(loc)
        parts.append(f"{field}: {_message(error)}")
    return "; ".join(dict.fromkeys(parts)) or "invalid request"


def headers(exc: LeakbisectError) -> dict[str, str] | None:
    """The headers an answer to `exc` carries besides its status."""
    if isinstance(exc, Unauthenticated):
        return {"WWW-Authenticate": "Bearer"}
    retry = exc.retry_after_s if isinstance(exc, LimitExceeded) else None
    return {"Retry-After": str(retry)} if retry is not None else None


async def _on_leakbisect_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, LeakbisectError)
    return JSONResponse(
        status_code=http_status(exc), content={"detail": exc.detail()}, headers=headers(exc)
    )


async def _on_validation_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    return JSONResponse(
        status_code=status.HTTP_422_UNPROCESSABLE_CONTENT,
        content={"detail": validation_detail(exc)},
    )


async def _on_unexpected(request: Request, exc: Exception) -> JSONResponse:
    log.error("%s %s failed", request.method, request.url.path, exc_info=exc)
    return JSONResponse(
        status_code=status.HTTP_500_INTERNAL_SERVER_ERROR,
        content={"detail": f"internal server error ({type(exc).__name__})"},
    )


def install(app: FastAPI) -> None:
    """Register the handlers on `app`."""
    app.add_exception_handler(LeakbisectError, _on_leakbisect_error)
    app.add_exception_handler(RequestValidationError, _on_validation_error)
    app.add_exception_handler(Exception, _on_unexpected)
