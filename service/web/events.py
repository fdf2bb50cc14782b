"""Server-Sent Events that only say "job N changed"; the page then re-fetches its fragment.

One `Watcher` per engine (and process) polls the database once per `interval` seconds for a
fingerprint of every open or recently changed job (status, updated_at, and its trials'
counts, starts, finishes and last heartbeat memory) and tells every open stream which jobs
changed. The streams carry no job data, so a stream needs no per-job authorisation beyond
being allowed to read that job; the fragment it triggers is checked as any page is.

The database is polled, not notified, so this works the same on SQLite and Postgres and
across `--workers` processes and separate runners; one query per second per process,
however many browsers are watching. The watcher runs only while some stream is open.
"""

import asyncio
import contextlib
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

from anyio import to_thread
from sqlalchemy import case, func, or_
from sqlalchemy.engine import Engine
from sqlmodel import Session, col, select

from service.models import Job, JobStatus, Trial, TrialStatus, utcnow

RECENT = timedelta(minutes=5)
KEEPALIVE_S = 15.0
STREAM_S = 300.0  # streams end after this; the browser reconnects (retry below)
RETRY_MS = 3000


def fingerprints(engine: Engine) -> dict[int, tuple[Any, ...]]:
    """Per open or recently changed job: what changes when anything on its page does."""
    open_jobs = [JobStatus.QUEUED.value, JobStatus.RUNNING.value]
    leased = func.sum(case((col(Trial.status) == TrialStatus.LEASED.value, 1), else_=0))
    done = func.sum(case((col(Trial.status) == TrialStatus.DONE.value, 1), else_=0))
    query = (
        select(
            Job.id,
            Job.status,
            Job.updated_at,
            func.count(col(Trial.id)),
            leased,
            done,
            func.max(Trial.started_at),
            func.max(Trial.finished_at),
            func.sum(Trial.rss),
            func.sum(Trial.attempt),
        )
        .select_from(Job)
        .join(Trial, col(Trial.job_id) == col(Job.id), isouter=True)
        .where(or_(col(Job.status).in_(open_jobs), col(Job.updated_at) > utcnow() - RECENT))
        .group_by(col(Job.id), col(Job.status), col(Job.updated_at))
    )
    with Session(engine) as session:
        return {row[0]: tuple(row[1:]) for row in session.exec(query)}


class Watcher:
    """Polls `fingerprints` while streams are open and fans changes out to them."""

    def __init__(self, engine: Engine, interval: float = 1.0) -> None:
        self.engine = engine
        self.interval = interval
        self.queues: set[asyncio.Queue[set[int]]] = set()
        self.task: asyncio.Task[None] | None = None
        self.last: dict[int, tuple[Any, ...]] | None = None

    async def _poll(self) -> None:
        while self.queues:
            try:
                now = await to_thread.run_sync(fingerprints, self.engine)
            except Exception:  # noqa: BLE001 - a database hiccup: try again next round
                await asyncio.sleep(self.interval)
                continue
            if self.last is not None:
                changed = {j for j, fp in now.items() if self.last.get(j) != fp}
                if changed:
                    for queue in list(self.queues):
                        queue.put_nowait(changed)
            self.last = now
            await asyncio.sleep(self.interval)
        self.task, self.last = None, None

    @contextlib.asynccontextmanager
    async def subscribe(self) -> AsyncIterator[asyncio.Queue[set[int]]]:
        queue: asyncio.Queue[set[int]] = asyncio.Queue()
        self.queues.add(queue)
        if self.task is None:
            self.task = asyncio.create_task(self._poll())
        try:
            yield queue
        finally:
            self.queues.discard(queue)


def message(event: str, job_id: int) -> str:
    return f"event: {event}\ndata: job {job_id} changed\n\n"


async def stream(
    watcher: Watcher, event: str, job_id: int | None, is_disconnected: Any
) -> AsyncIterator[str]:
    """The SSE body: `event` for each change (of `job_id` only, when given)."""
    yield f"retry: {RETRY_MS}\n: connected\n\n"
    loop = asyncio.get_running_loop()
    ends = loop.time() + STREAM_S
    async with watcher.subscribe() as queue:
        while loop.time() < ends:
            try:
                changed = await asyncio.wait_for(queue.get(), timeout=KEEPALIVE_S)
            except TimeoutError:
                if await is_disconnected():
                    return
                yield ": keepalive\n\n"
                continue
            if job_id is None:
                # The list's stream names no job: it may be one this caller cannot see.
                yield f"event: {event}\ndata: jobs changed\n\n"
            elif job_id in changed:
                yield message(event, job_id)
