"""Webhooks: a job that ends tells the URLs it names, with a signed JSON POST, retried.

Rules, in code order:

1. `enqueue` (where a job's status becomes final, service/scheduler.py `ended`): one
   delivery row per target: the job's --webhook URL, and the operator's BISECT_WEBHOOK_URL
   (a row with no URL: read from the settings when sent, never stored or shown, since it
   may be a capability URL). The rows are written in the job's own transaction, so a job
   that ended has them, and they outlive a restart of the server.
2. The rule (service/policy.py `webhook_reach`): where a job's webhook may lead: the hosts
   in BISECT_WEBHOOK_HOSTS when listed, else any host whose addresses are all public, with
   or without tokens (the server sends it, so a tokenless one is no exception). Checked at
   submission (service/policy.py) and again right before each attempt (a name may resolve
   elsewhere by then). The operator's URL, and a `bisect-cli run` job's (its user's own),
   are not held to it.
3. `claim`: an attempt is made by the process that claimed its row: one conditional UPDATE
   that sets a claim token until twice the attempt's timeout has passed (`FOR UPDATE SKIP
   LOCKED` on Postgres, as service/queue.py claims a trial; SQLite's single writer
   elsewhere), so two API processes never make the same attempt. A process that dies
   mid-attempt leaves a claim that expires and the attempt is made again: delivery is at
   least once, and a receiver dedupes on the payload's `delivery`.
4. `payload`: the event, the delivery's id, the job's id, status, message, package, range,
   find_fix, its pair under the mode's names (`last_good`/`first_bad`, or `last_bad`/
   `first_good` for --find-fix), its API URL and page URL (BISECT_PUBLIC_URL, else the
   site it was submitted through; None for a local job) and finished_at. Compact JSON,
   keys sorted, the same bytes for every attempt.
5. `signature`: ``X-Leakbisect-Signature: t=<unix seconds>,v1=<hex>`` where hex is
   HMAC-SHA256 of ``"<t>." + body`` under BISECT_WEBHOOK_SECRET. A receiver recomputes it,
   compares in constant time, and refuses a `t` far from its clock (a replay).
6. `post`: a timeout on each step of the request, no redirect followed (a 3xx is a
   failure: the place it names was never checked), no proxy from the environment; a 2xx
   is delivered. Of the answer only a short printable excerpt is kept.
7. `record`: after the n-th failed attempt the next waits BISECT_WEBHOOK_BACKOFF_S[n-1];
   when the waits are used up the delivery has failed. Each attempt is kept on the row
   (time, HTTP status or error, excerpt, next attempt) and logged (never the secret,
   never the operator's URL).
8. The API server's round (`deliver_due` in a service/periodic.py thread, beside
   maintenance's) sends the due rows of its jobs; `bisect-cli run` sends its own job's
   rows itself (`deliver_job`), waiting out the backoff, and no server ever sends a local
   job's.
"""

import hashlib
import hmac
import json
import logging
import secrets
import time
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

import httpx
from sqlalchemy import or_, update
from sqlmodel import Session, col, func, select

from contract import outbound
from contract.outbound import Reach
from contract.wire import API_PREFIX
from service import policy, store
from service.models import Job, WebhookDelivery, WebhookStatus, utcnow
from service.report import build_report
from service.settings import Settings
from service.text import printable

log = logging.getLogger(__name__)

EVENT = "job.finished"
SIGNATURE_HEADER = "X-Leakbisect-Signature"
DELIVERY_HEADER = "X-Leakbisect-Delivery"
EVENT_HEADER = "X-Leakbisect-Event"
OPERATOR = "the operator's webhook"
EXCERPT_CHARS = 200
EXCERPT_BYTES = 4096  # read at most this much of an answer, whatever it sends


def enqueue(session: Session, job: Job, operator: bool) -> None:
    """Rule 1: the rows a job's end sends (`operator`: BISECT_WEBHOOK_URL is set)."""
    targets: list[str | None] = [job.webhook_url] if job.webhook_url else []
    if operator:
        targets.append(None)
    for url in targets:
        session.add(WebhookDelivery(job_id=job.id, url=url))  # type: ignore[arg-type]


def claim(
    session: Session, *, lease_s: float, local: bool = False, job_id: int | None = None
) -> tuple[WebhookDelivery, str] | None:
    """Rule 3: the next due row (of local jobs, or of one job) and its claim token."""
    now, token = utcnow(), secrets.token_hex(8)
    D = WebhookDelivery
    due = (
        D.status == WebhookStatus.PENDING,
        col(D.next_at) <= now,
        or_(col(D.claimed_until).is_(None), col(D.claimed_until) < now),
    )
    pick = (
        select(D.id)
        .join(Job, col(Job.id) == D.job_id)
        .where(*due, col(Job.local) == local)
        .order_by(col(D.next_at), col(D.id))
        .limit(1)
        .with_for_update(of=D, skip_locked=True)
    )
    if job_id is not None:
        pick = pick.where(D.job_id == job_id)
    stmt = (
        update(D)
        .where(col(D.id) == pick.scalar_subquery(), *due)  # the rule again: no window
        .values(claim=token, claimed_until=now + timedelta(seconds=lease_s))
        .returning(D.id)
        .execution_options(synchronize_session=False)
    )
    row_id = session.exec(stmt).scalar_one_or_none()  # type: ignore[call-overload]
    session.commit()
    if row_id is None:
        return None
    row = session.get(D, row_id, populate_existing=True)
    return (row, token) if row is not None else None


def payload(session: Session, settings: Settings, job: Job, delivery_id: int) -> dict[str, Any]:
    """Rule 4: what the receiver is told."""
    report = build_report(job, store.candidates_of(session, job), store.trials_of(session, job))
    base = None if job.local else (settings.public_url or job.site_url or "").rstrip("/") or None
    old, new = report.names
    return {
        "event": EVENT,
        "delivery": delivery_id,
        "job_id": job.id,
        "status": job.status,
        "message": job.message,
        "package": report.package,
        "range": report.range,
        "find_fix": job.find_fix,
        old: report.last_old,
        new: report.first_new,
        "url": f"{base}{API_PREFIX}/jobs/{job.id}" if base else None,
        "page_url": f"{base}/jobs/{job.id}" if base else None,
        "finished_at": job.finished_at.isoformat() if job.finished_at else None,
    }


def body_of(content: dict[str, Any]) -> bytes:
    return json.dumps(content, separators=(",", ":"), sort_keys=True).encode()


def signature(secret: str, timestamp: int, body: bytes) -> str:
    """Rule 5: the signature header's value."""
    mac = hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256)
    return f"t={timestamp},v1={mac.hexdigest()}"


def post(url: str, body: bytes, headers: dict[str, str], timeout_s: float) -> tuple[int, str]:
    """Rule 6: the receiver's status and an excerpt of its answer (httpx errors raise)."""
    with (
        httpx.Client(timeout=timeout_s, follow_redirects=False, trust_env=False) as client,
        client.stream("POST", url, content=body, headers=headers) as response,
    ):
        head = b""
        for chunk in response.iter_bytes():
            head += chunk
            if len(head) >= EXCERPT_BYTES:
                break
    text = " ".join(printable(head[:EXCERPT_BYTES].decode("utf-8", "replace")).split())
    return response.status_code, text[:EXCERPT_CHARS]


def _one_line(exc: Exception) -> str:
    text = " ".join(printable(str(exc)).split()) or "no detail"
    return f"{type(exc).__name__}: {text}"[:EXCERPT_CHARS]


def attempt(
    session: Session, settings: Settings, row: WebhookDelivery, rule: Reach | None
) -> dict[str, Any]:
    """Make one attempt at `row` (claimed); its log entry, without `next_at` yet."""
    started = utcnow()  # the attempt's time is when it began, not when it gave up
    status: int | None = None
    excerpt: str | None = None
    url = row.url or settings.webhook_url
    secret = settings.webhook_secret
    try:
        if url is None or secret is None:
            missing = "BISECT_WEBHOOK_SECRET" if url else "BISECT_WEBHOOK_URL"
            raise LookupError(f"{missing} is no longer set")
        # The operator's own URL is not held to the rule (rule 2).
        policy.check_webhook_url(url, rule if row.url else None)
        job = store.job(session, row.job_id)
        body = body_of(payload(session, settings, job, row.id))  # type: ignore[arg-type]
        session.commit()  # no transaction held while the receiver answers
        headers = {
            "Content-Type": "application/json",
            "User-Agent": "leakbisect-webhook/1",
            EVENT_HEADER: EVENT,
            DELIVERY_HEADER: str(row.id),
            SIGNATURE_HEADER: signature(secret.get_secret_value(), int(time.time()), body),
        }
        status, excerpt = post(url, body, headers, settings.webhook_timeout_s)
        result = f"HTTP {status}" + (" (redirects are not followed)" if 300 <= status < 400 else "")
    except outbound.Refused as exc:
        result = f"refused: {exc}"
    except (httpx.HTTPError, LookupError, OSError) as exc:
        result = _one_line(exc)
    return {
        "at": started.isoformat(),
        "result": result,
        "status": status,
        "excerpt": excerpt or None,
    }


def record(
    session: Session, settings: Settings, row: WebhookDelivery, token: str, entry: dict[str, Any]
) -> bool:
    """Rule 7: keep the attempt and schedule the next; False when the claim was lost."""
    tried = [*row.attempts, entry]
    delivered = entry["status"] is not None and 200 <= entry["status"] < 300
    waits = settings.webhook_backoff_s
    if delivered or len(tried) > len(waits):
        status, next_at = (WebhookStatus.DELIVERED if delivered else WebhookStatus.FAILED), None
    else:
        status, next_at = WebhookStatus.PENDING, utcnow() + timedelta(seconds=waits[len(tried) - 1])
    entry["next_at"] = next_at.isoformat() if next_at else None
    D = WebhookDelivery
    stmt = (
        update(D)
        .where(col(D.id) == row.id, col(D.claim) == token)
        .values(attempts=tried, status=status, next_at=next_at, claim=None, claimed_until=None)
        .execution_options(synchronize_session=False)
    )
    kept = session.exec(stmt).rowcount == 1  # type: ignore[call-overload]
    session.commit()
    return kept


def _said(row: tuple[int | None, int, str | None], number: int, entry: dict[str, Any]) -> str:
    """The attempt's log line: which delivery, to where, what came back, what next."""
    row_id, job_id, url = row
    then = f"next attempt at {entry['next_at']}" if entry["next_at"] else "no further attempt"
    return (
        f"webhook {row_id} of job {job_id} to {url or OPERATOR}: attempt {number}: "
        f"{entry['result']}; {then}"
    )


def deliver_due(
    session: Session,
    settings: Settings,
    *,
    local: bool = False,
    job_id: int | None = None,
    say: Callable[[str], None] = log.info,
) -> int:
    """Make every attempt due now (of local jobs under no rule, else under `reach`)."""
    rule = None if local else policy.webhook_reach(settings)
    made = 0
    while (claimed := claim(session, lease_s=2 * settings.webhook_timeout_s, local=local,
                            job_id=job_id)) is not None:  # fmt: skip
        row, token = claimed
        number, ident = len(row.attempts) + 1, (row.id, row.job_id, row.url)
        entry = attempt(session, settings, row, rule)
        if record(session, settings, row, token, entry):
            say(_said(ident, number, entry))
        else:
            log.warning("webhook %s: its claim expired during the attempt; not recorded", row.id)
        made += 1
    return made


def next_due(session: Session, job_id: int) -> datetime | None:
    """When the job's next pending attempt is due; None when none is pending."""
    D = WebhookDelivery
    query = select(func.min(D.next_at)).where(D.job_id == job_id, D.status == WebhookStatus.PENDING)
    return session.exec(query).one()


def deliver_job(
    session: Session,
    settings: Settings,
    job_id: int,
    say: Callable[[str], None],
    sleep: Callable[[float], None] = time.sleep,
) -> None:
    """Rule 8: `bisect-cli run` sends its own job's webhooks, waiting out the backoff."""
    while True:
        deliver_due(session, settings, local=True, job_id=job_id, say=say)
        due = next_due(session, job_id)
        if due is None:
            return
        sleep(max(0.0, (_aware(due) - utcnow()).total_seconds()))


def _aware(moment: datetime) -> datetime:
    # SQLite hands datetimes back without their zone; every one stored is UTC.
    return moment if moment.tzinfo else moment.replace(tzinfo=utcnow().tzinfo)
