"""The API process's background rounds: one daemon thread per kind of work, each running
its function every interval (maintenance's `tick`, webhooks' `deliver_due`).

Rules, in code order:

1. An interval of 0 or less never starts the thread (an operator's "off").
2. The first round runs one interval after the start, then one interval after each round
   ends: rounds never overlap, and a slow round delays the next rather than piling up.
3. Each round opens its own Session on the engine and closes it: nothing is held between.
4. A round that raises is logged with its traceback and the next one runs as planned: the
   database or a receiver may well be back by then.
5. `stop` ends the loop and waits up to `timeout` for a round in progress.
"""

import logging
import threading
from collections.abc import Callable

from sqlalchemy.engine import Engine
from sqlmodel import Session

log = logging.getLogger(__name__)


class Periodic:
    """`work(session)` every `interval_s` in a daemon thread called `name`."""

    def __init__(
        self, name: str, engine: Engine, interval_s: float, work: Callable[[Session], object]
    ) -> None:
        self.name = name
        self.engine = engine
        self.interval_s = interval_s
        self.work = work
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self.interval_s <= 0:
            return
        self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                with Session(self.engine) as session:
                    self.work(session)
            except Exception:  # noqa: BLE001 - rule 4: the next round goes on
                log.exception("%s: round failed", self.name)

    def stop(self, timeout: float = 30.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None
