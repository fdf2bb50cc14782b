"""Finished reports on disk until the server takes them (the runner's state directory).

A trial's report is written here before the runner posts it and removed once the server
answers (stored, or refused for good: 409, 403, 404, another 4xx). So neither a server
outage of any length nor a runner restart loses a finished trial: the runner keeps
retrying, and a runner that starts re-sends what an earlier one left behind (the server
takes it if that lease is still current: service/queue.py renews leases when the API
starts).

Each entry is one JSON file, ``trial-ID-aATTEMPT.json``, mode 0600 in a 0700 directory:
it holds the runner id and the runner secret the report must be sent with (the runner that
resends it may have registered since under another id). Files are written to a temporary
name and renamed, so a crash mid-write leaves no half entry; an entry that cannot be read
is renamed ``*.bad`` and skipped.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from pydantic import ValidationError

from runners.wire import TrialReport


@dataclass
class Spooled:
    """One report waiting for the server, and the identity to send it as."""

    report: TrialReport
    runner_id: str
    runner_secret: str | None
    path: Path | None = None  # None: kept in memory only (no state directory)

    @property
    def trial_id(self) -> int:
        return self.report.trial_id

    def discard(self) -> None:
        if self.path is not None:
            self.path.unlink(missing_ok=True)


class Spool:
    """The reports under ``root/spool``; ``root`` None keeps them in memory only."""

    def __init__(self, root: Path | None) -> None:
        self.dir = None if root is None else root / "spool"

    def _ensure(self) -> Path:
        assert self.dir is not None
        self.dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.dir.chmod(0o700)  # it holds runner secrets
        return self.dir

    def put(self, report: TrialReport, runner_id: str, runner_secret: str | None) -> Spooled:
        """Write the report to disk (durably, before it is posted)."""
        entry = Spooled(report, runner_id, runner_secret)
        if self.dir is None:
            return entry
        directory = self._ensure()
        name = f"trial-{report.trial_id}-a{report.attempt}.json"
        tmp = directory / f".{name}.tmp"
        body = {
            "runner_id": runner_id,
            "runner_secret": runner_secret,
            "report": report.model_dump(mode="json"),
        }
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as out:
            json.dump(body, out)
            out.flush()
            os.fsync(out.fileno())
        entry.path = directory / name
        os.replace(tmp, entry.path)
        return entry

    def pending(self) -> tuple[list[Spooled], list[str]]:
        """Entries left by an earlier run, oldest trial first; and the names set aside
        as unreadable."""
        if self.dir is None or not self.dir.is_dir():
            return [], []
        entries, bad = [], []
        for path in sorted(self.dir.glob("trial-*.json")):
            try:
                body = json.loads(path.read_text())
                entry = Spooled(
                    TrialReport.model_validate(body["report"]),
                    str(body["runner_id"]),
                    body.get("runner_secret"),
                    path,
                )
            except (OSError, ValueError, KeyError, TypeError, ValidationError):
                path.rename(path.with_suffix(".bad"))
                bad.append(path.name)
                continue
            entries.append(entry)
        entries.sort(key=lambda e: e.trial_id)
        return entries, bad
