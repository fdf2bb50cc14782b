"""The status page's routes: HTML pages, htmx fragments, SSE, curves, forms.

Every page renders the whole current state on the server (usable without JavaScript);
htmx then re-fetches the `#job-live` or `#jobs` fragment when the SSE stream says the job
changed, or every 30 s when it cannot. Forms post back with a CSRF token and redirect
(303), so the same buttons work with and without JavaScript; cancelling goes through a
confirmation page.
"""

from typing import Annotated, Any
from urllib.parse import parse_qsl, quote, urlencode

from fastapi import APIRouter, Query, Request
from fastapi.responses import (
    HTMLResponse,
    JSONResponse,
    PlainTextResponse,
    RedirectResponse,
    Response,
    StreamingResponse,
)
from pydantic import ValidationError
from sqlmodel import Session
from starlette.concurrency import run_in_threadpool

from contract.errors import Forbidden, InvalidInput, LeakbisectError, LimitExceeded
from service import actions, store
from service.access import Caller
from service.db import get_engine
from service.http.deps import MAX_OFFSET, site_url
from service.http.errors import http_status
from service.markdown import headline, markdown_report
from service.models import JobStatus
from service.options import MAX_REPEATS
from service.schemas import AgainRequest, contradiction_note, reuse_note
from service.settings import Settings
from service.views import job_markdown, job_public, job_webhooks, progress_of, readable_job
from service.web import auth, views
from service.web.events import Stream, Watcher
from service.web.render import render

router = APIRouter(include_in_schema=False)
STATUSES = [s.value for s in JobStatus]


def _settings(request: Request) -> Settings:
    return request.app.state.settings


def _engine(request: Request) -> Any:
    return get_engine(_settings(request).effective_database_url)


def _to_login(request: Request) -> RedirectResponse:
    target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
    return RedirectResponse(f"/login?next={quote(target)}", status_code=303)


def _unauthorized() -> PlainTextResponse:
    return PlainTextResponse("log in first: /login", status_code=401)


def _error(request: Request, caller: Caller | None, exc: LeakbisectError) -> HTMLResponse:
    return render(
        request, "error.html", {"caller": caller, "message": exc.detail()}, http_status(exc)
    )


# --------------------------------------------------------------------------- login


@router.get("/login", response_class=HTMLResponse)
def login_form(request: Request, next: str = "/") -> Response:
    return render(
        request, "login.html", {"caller": None, "next": _safe_next(next), "failed": False}
    )


def _safe_next(target: str) -> str:
    # Only a path on this site: never //host or a scheme (an open redirect).
    return (
        target
        if target.startswith("/") and not target.startswith("//") and "\\" not in target
        else "/"
    )


async def _form(request: Request) -> dict[str, str]:
    body = (await request.body()).decode("utf-8", "replace")
    return dict(parse_qsl(body, keep_blank_values=True))


@router.post("/login", response_class=HTMLResponse)
async def login(request: Request) -> Response:
    form = await _form(request)
    if not auth.csrf_ok(request, form):
        return render(
            request,
            "error.html",
            {
                "caller": None,
                "message": "CSRF token missing or wrong: reload the page and try again",
            },
            403,
        )
    settings = _settings(request)
    try:
        caller = auth.attempt_login(request, form.get("token", ""))
    except LimitExceeded as exc:  # throttled: 429 with Retry-After, the token not compared
        refused = _error(request, None, exc)
        refused.headers["Retry-After"] = str(exc.retry_after_s)
        return refused
    if caller is None:
        context = {"caller": None, "next": _safe_next(form.get("next", "/")), "failed": True}
        return render(request, "login.html", context, 401)
    response = RedirectResponse(_safe_next(form.get("next", "/")), status_code=303)
    auth.set_session(response, request, auth.session_value(settings, form["token"].strip()))
    return response


@router.post("/logout")
async def logout(request: Request) -> Response:
    form = await _form(request)
    if not auth.csrf_ok(request, form):
        return render(
            request, "error.html", {"caller": None, "message": "CSRF token missing or wrong"}, 403
        )
    response = RedirectResponse(
        "/login" if _settings(request).auth_enabled else "/", status_code=303
    )
    auth.clear_session(response)
    return response


# --------------------------------------------------------------------------- job list


def _list_context(
    request: Request, caller: Caller, status: str, package: str, page: int
) -> dict[str, Any]:
    chosen = JobStatus(status) if status in STATUSES else None
    owner = None if caller.sees_all else caller.name
    with Session(_engine(request)) as session:
        jobs, total = store.jobs_page(
            session,
            status=chosen,
            package=package.strip()[:200] or None,
            owner=owner,
            limit=views.PAGE_SIZE,
            offset=(page - 1) * views.PAGE_SIZE,
        )
        progress = progress_of(session, [j.id for j in jobs if j.id is not None])
    pages = max(1, -(-total // views.PAGE_SIZE))
    query = {k: v for k, v in (("status", status if chosen else ""), ("package", package)) if v}
    rows = [{"job": j, "result": views.result_text(j), "progress": progress[j.id]} for j in jobs]  # type: ignore[index]
    return {
        "caller": caller,
        "rows": rows,
        "total": total,
        "page": page,
        "pages": pages,
        "status": status if chosen else "",
        "package": package,
        "statuses": STATUSES,
        "query": urlencode(query),
        "prev_q": urlencode({**query, "page": page - 1}),
        "next_q": urlencode({**query, "page": page + 1}),
    }


# A page of the job list: its offset, (page - 1) x PAGE_SIZE, within `Offset`'s bound.
Page = Annotated[int, Query(ge=1, le=MAX_OFFSET // views.PAGE_SIZE)]


@router.get("/", response_class=HTMLResponse)
def job_list(request: Request, status: str = "", package: str = "", page: Page = 1) -> Response:
    caller = auth.web_caller(request)
    if caller is None:
        return _to_login(request)
    return render(request, "jobs.html", _list_context(request, caller, status, package, page))


@router.get("/fragments/jobs", response_class=HTMLResponse)
def job_list_fragment(
    request: Request, status: str = "", package: str = "", page: Page = 1
) -> Response:
    caller = auth.web_caller(request)
    if caller is None:
        return _unauthorized()
    return render(request, "_jobs.html", _list_context(request, caller, status, package, page))


# --------------------------------------------------------------------------- job page


def _job_context(
    request: Request, caller: Caller, job_id: int, candidate: str | None
) -> dict[str, Any]:
    with Session(_engine(request)) as session:
        job = readable_job(session, job_id, caller)
        public = job_public(session, job)
        candidates = store.candidates_of(session, job)
        trials = store.trials_of(session, job)
        webhooks = job_webhooks(session, job)
    cells = views.strip(candidates, trials, public)
    versions = {c.version: c for c in candidates}
    selected = candidate if candidate in versions else views.default_selection(public, cells)
    for cell in cells:
        cell.selected = cell.version == selected
    chosen = versions.get(selected or "")
    row = next((r for r in public.candidates if r.version == selected), None)
    reference = versions.get(public.last_old or "") or (candidates[0] if candidates else None)
    report = public.report()
    base = site_url(request, _settings(request))
    return {
        "caller": caller,
        "job": job,
        "public": public,
        "cells": cells,
        "selected": chosen,
        # The selected release's notes, naming only the owner's own jobs (service/report.py).
        "reuse_note": reuse_note(row) if row else None,
        "contradiction_note": contradiction_note(row) if row else None,
        "trials": views.trial_rows(trials, chosen),
        "chart": views.range_chart(candidates, trials, public),
        "freeze_changes": views.freeze_changes(chosen, reference),
        "reference": reference,
        "headline": headline(report),
        "markdown": markdown_report(report, f"{base}/jobs/{job_id}"),
        "finished": JobStatus(job.status).finished,
        "may_change": caller.may_change(job.owner),
        "verdict_words": views.VERDICT_WORDS,
        "webhooks": webhooks,
    }


def _job_response(request: Request, job_id: int, candidate: str | None, template: str) -> Response:
    caller = auth.web_caller(request)
    if caller is None:
        return _to_login(request) if template == "job.html" else _unauthorized()
    try:
        return render(request, template, _job_context(request, caller, job_id, candidate))
    except LeakbisectError as exc:
        return _error(request, caller, exc)


@router.get("/jobs/{job_id}", response_class=HTMLResponse)
def job_page(request: Request, job_id: int, candidate: str | None = None) -> Response:
    return _job_response(request, job_id, candidate, "job.html")


@router.get("/jobs/{job_id}/fragments/live", response_class=HTMLResponse)
def job_fragment(request: Request, job_id: int, candidate: str | None = None) -> Response:
    return _job_response(request, job_id, candidate, "_job_live.html")


@router.get("/jobs/{job_id}/trials/{number}/curve.json")
def trial_curve(request: Request, job_id: int, number: int) -> Response:
    caller = auth.web_caller(request)
    if caller is None:
        return _unauthorized()
    engine = _engine(request)
    try:
        with Session(engine) as session:
            readable_job(session, job_id, caller)
            trial = store.trial_by_number(session, job_id, number)
        return JSONResponse(views.curve(engine, trial))
    except LeakbisectError as exc:
        return JSONResponse({"detail": exc.detail()}, status_code=http_status(exc))


@router.get("/jobs/{job_id}/report.md")
def report_md(request: Request, job_id: int) -> Response:
    caller = auth.web_caller(request)
    if caller is None:
        return _unauthorized()
    try:
        with Session(_engine(request)) as session:
            job = readable_job(session, job_id, caller)
            url = f"{site_url(request, _settings(request))}/jobs/{job_id}"
            text = job_markdown(session, job, url)
    except LeakbisectError as exc:
        return PlainTextResponse(exc.detail(), status_code=http_status(exc))
    return PlainTextResponse(text, media_type="text/markdown; charset=utf-8")


# --------------------------------------------------------------------------- actions


@router.get("/jobs/{job_id}/cancel", response_class=HTMLResponse)
def cancel_confirm(request: Request, job_id: int) -> Response:
    caller = auth.web_caller(request)
    if caller is None:
        return _to_login(request)
    try:
        with Session(_engine(request)) as session:
            job = readable_job(session, job_id, caller)
        return render(request, "confirm.html", {"caller": caller, "job": job})
    except LeakbisectError as exc:
        return _error(request, caller, exc)


async def _checked_post(request: Request) -> tuple[Caller | None, dict[str, str], Response | None]:
    form = await _form(request)
    caller = auth.web_caller(request)
    if caller is None:
        return None, form, _unauthorized()
    if not auth.csrf_ok(request, form):
        return (
            caller,
            form,
            render(
                request,
                "error.html",
                {
                    "caller": caller,
                    "message": "CSRF token missing or wrong: reload the page and try again",
                },
                403,
            ),
        )
    if caller.role == "viewer":
        return caller, form, _error(request, caller, Forbidden("a view token can only read"))
    return caller, form, None


@router.post("/jobs/{job_id}/cancel")
async def cancel_post(request: Request, job_id: int) -> Response:
    caller, _, refused = await _checked_post(request)
    if refused is not None or caller is None:
        return refused or _unauthorized()

    def cancel() -> None:
        with Session(_engine(request)) as session:
            reason = "cancelled from the status page"
            actions.cancel_job(session, _settings(request), job_id, caller, reason)

    try:
        await run_in_threadpool(cancel)
    except LeakbisectError as exc:
        return _error(request, caller, exc)
    return RedirectResponse(f"/jobs/{job_id}", status_code=303)


@router.post("/jobs/{job_id}/again")
async def again_post(request: Request, job_id: int) -> Response:
    caller, form, refused = await _checked_post(request)
    if refused is not None or caller is None:
        return refused or _unauthorized()
    try:
        repeats = int(form["repeats"]) if form.get("repeats", "").strip() else None
        body = AgainRequest(repeats=repeats, candidate=form.get("candidate") or None)
    except ValidationError as exc:
        first = exc.errors()[0]
        field = ".".join(str(p) for p in first["loc"]) or "form"
        return _error(request, caller, InvalidInput(first["msg"], field=field))
    except ValueError:  # int() of something that is no number
        number = InvalidInput(f"a whole number from 1 to {MAX_REPEATS}", field="repeats")
        return _error(request, caller, number)

    def again() -> int | None:
        # The database, the job's options validated again (its environment files parsed)
        # and the first step of the search: never on the event loop (issue 26 row 2).
        with Session(_engine(request)) as session:
            settings = _settings(request)
            site = site_url(request, settings)
            return actions.again_job(session, settings, job_id, caller, body, site).id

    try:
        new_id = await run_in_threadpool(again)
    except LeakbisectError as exc:
        return _error(request, caller, exc)
    return RedirectResponse(f"/jobs/{new_id}", status_code=303)


# --------------------------------------------------------------------------- events


def _watcher(request: Request) -> Watcher:
    app = request.app
    settings = _settings(request)
    watcher = getattr(app.state, "web_watcher", None)
    if watcher is None:
        watcher = Watcher(
            get_engine(settings.effective_database_url), max_streams=settings.max_streams
        )
        app.state.web_watcher = watcher
    return watcher


def _sse(request: Request, caller: Caller, event: str, job_id: int | None) -> Response:
    # One client: a token's name, or with no tokens the address (service/web/events.py).
    client = caller.name or (request.client.host if request.client else "unknown")
    watcher = _watcher(request)
    try:
        watcher.open_stream(client)
    except LimitExceeded as exc:
        headers = {"Retry-After": str(exc.retry_after_s)}
        return PlainTextResponse(exc.detail(), status_code=http_status(exc), headers=headers)
    body = Stream(watcher, client, caller, event, job_id, request.is_disconnected)
    headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
    return StreamingResponse(body, media_type="text/event-stream", headers=headers)


@router.get("/events")
def list_events(request: Request) -> Response:
    """`event: jobs` whenever a job the caller may read changes."""
    caller = auth.web_caller(request)
    if caller is None:
        return _unauthorized()
    return _sse(request, caller, "jobs", None)


@router.get("/events/jobs/{job_id}")
def job_events(request: Request, job_id: int) -> Response:
    """`event: changed` whenever job `job_id` changes (data: "job N changed")."""
    caller = auth.web_caller(request)
    if caller is None:
        return _unauthorized()
    try:
        with Session(_engine(request)) as session:
            readable_job(session, job_id, caller)
    except LeakbisectError as exc:
        return PlainTextResponse(exc.detail(), status_code=http_status(exc))
    return _sse(request, caller, "changed", job_id)
