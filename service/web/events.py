"""Server-Sent Events that only say "job N changed"; the page then re-fetches its fragment.

One `Watcher` per engine (and process) polls the database once per `interval` seconds for a
fingerprint of every open or recently changed job (status, updated_at, and its trials'
counts, starts, finishes and last heartbeat memory) and tells every open stream which jobs
changed, and whose they are. A stream tells its caller only of jobs it may read
(`Caller.may_read`): the list's stream says "jobs changed" when one of those changed,
never when only another owner's did; a job's stream needs the caller to read that job.
The streams carry no job data; the fragment they trigger is checked as any page is.

Each client (a token's name; with no tokens, the client address) may hold at most
`max_streams` streams open in one process (`Watcher.open_stream`): the next one is
refused with `LimitExceeded` (429), before anything is streamed.

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

from contract.errors import LimitExceeded
from service.access import Caller
from service.models import Job, JobStatus, Trial, TrialStatus, utcnow

RECENT = timedelta(minutes=5)
KEEPALIVE_S = 15.0
STREAM_S = 300.0  # streams end after this; the browser reconnects (retry below)
RETRY_MS = 3000
Changes = dict[int, str | None]  # job id -> its owner


def fingerprints(engine: Engine) -> dict[int, tuple[Any, ...]]:
    """Per open or recently changed job: its owner first, then what changes when anything
    on its page does."""
    open_jobs = [JobStatus.QUEUED.value, JobStatus.RUNNING.value]
    leased = func.sum(case((col(Trial.status) == TrialStatus.LEASED.value, 1), else_=0))
    done = func.sum(case((col(Trial.status) == TrialStatus.DONE.value, 1), else_=0))
    query = (
        select(
            Job.id,
            Job.owner,
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
        .group_by(col(Job.id), col(Job.owner), col(Job.status), col(Job.updated_at))
    )
    with Session(engine) as session:
        return {row[0]: tuple(row[1:]) for row in session.exec(query)}


class Watcher:
    """Polls `fingerprints` while streams are open and fans changes out to them."""

    def __init__(self, engine: Engine, interval: float = 1.0, max_streams: int = 8) -> None:
        self.engine = engine
        self.interval = interval
        self.max_streams = max_streams
        self.queues: set[asyncio.Queue[Changes]] = set()
        self.open: dict[str, int] = {}  # client -> streams it holds open
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
                changed = {j: fp[0] for j, fp in now.items() if self.last.get(j) != fp}
                if changed:
                    for queue in list(self.queues):
                        queue.put_nowait(changed)
            self.last = now
            await asyncio.sleep(self.interval)
        self.task, self.last = None, None

    def open_stream(self, client: str) -> None:
        """Count a stream `client` opens, or refuse it (LimitExceeded) beyond the cap; the
        stream gives its place back when it ends (`stream`)."""
        if self.open.get(client, 0) >= self.max_streams:
            raise LimitExceeded(
                f"too many live streams: at most {self.max_streams} per client at once "
                "(BISECT_MAX_STREAMS); close a page or wait for one to end",
                retry_after_s=int(RETRY_MS / 1000),
            )
        self.open[client] = self.open.get(client, 0) + 1

    def close_stream(self, client: str) -> None:
        left = self.open.get(client, 0) - 1
        if left > 0:
            self.open[client] = left
        else:
            self.open.pop(client, None)

    @contextlib.asynccontextmanager
    async def subscribe(self) -> AsyncIterator[asyncio.Queue[Changes]]:
        queue: asyncio.Queue[Changes] = asyncio.Queue()
        self.queues.add(queue)
        if self.task is None:
            self.task = asyncio.create_task(self._poll())
        try:
            yield queue
        finally:
            self.queues.discard(queue)


def message(event: str, job_id: int) -> str:
    return f"event: {event}\ndata: job {job_id} changed\n\n"


def _tells(caller: Caller, job_id: int | None, changed: Changes) -> bool:
    """Whether this change is news to the caller's stream (see the module docstring)."""
    if job_id is not None:
        return job_id in changed
    return any(caller.may_read(owner) for owner in changed.values())


class Stream:
    """The SSE body of one stream: `event` for each change (of `job_id` only, when given)
    that `caller` may read. Made after `Watcher.open_stream(client)`; its place is given
    back when it ends, or when it is dropped without ever being sent."""

    def __init__(
        self,
        watcher: Watcher,
        client: str,
        caller: Caller,
        event: str,
        job_id: int | None,
        is_disconnected: Any,
    ) -> None:
        self.watcher, self.client, self.caller = watcher, client, caller
        self.event, self.job_id, self.is_disconnected = event, job_id, is_disconnected
        self.closed = False

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.watcher.close_stream(self.client)

    def __del__(self) -> None:  # a response that never started its body
        self.close()

    async def __aiter__(self) -> AsyncIterator[str]:
        try:
            async for chunk in self._body():
                yield chunk
        finally:
            self.close()

    async def _body(self) -> AsyncIterator[str]:
        yield f"retry: {RETRY_MS}\n: connected\n\n"
        loop = asyncio.get_running_loop()
        ends = loop.time() + STREAM_S
        async with self.watcher.subscribe() as queue:
            while loop.time() < ends:
                try:
                    changed = await asyncio.wait_for(queue.get(), timeout=KEEPALIVE_S)
                except TimeoutError:
                    if await self.is_disconnected():
                        return
                    yield ": keepalive\n\n"
                    continue
                if not _tells(self.caller, self.job_id, changed):
                    continue
                if self.job_id is None:
                    yield f"event: {self.event}\ndata: jobs changed\n\n"
                else:
                    yield message(self.event, self.job_id)
