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

Never through a link (runners/safefs.py): the spool directory is opened ``O_NOFOLLOW`` and
its mode set on the descriptor; an entry is written to a fresh ``O_EXCL|O_NOFOLLOW``
temporary and renamed by directory descriptor; an entry is read only when it is a regular
file with one link, non-blocking and bounded (`MAX_ENTRY_BYTES`). A link, FIFO or device
planted as an entry is set aside as ``.bad`` like an unreadable one.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from pydantic import ValidationError

from contract.wire import TrialReport
from runners import safefs

# A report is bounded by what the API takes; an entry past this is not one of ours.
MAX_ENTRY_BYTES = 256 * 1024 * 1024


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

    def _open(self) -> int:
        """The spool directory's descriptor (made if missing), mode 0700: it holds runner
        secrets. Opened O_NOFOLLOW and chmod-ed on the descriptor, never by name."""
        assert self.dir is not None
        self.dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd = safefs.open_dir(self.dir)
        os.fchmod(fd, 0o700)
        return fd

    def put(self, report: TrialReport, runner_id: str, runner_secret: str | None) -> Spooled:
        """Write the report to disk (durably, before it is posted)."""
        entry = Spooled(report, runner_id, runner_secret)
        if self.dir is None:
            return entry
        name = f"trial-{report.trial_id}-a{report.attempt}.json"
        body = {
            "runner_id": runner_id,
            "runner_secret": runner_secret,
            "report": report.model_dump(mode="json"),
        }
        fd = self._open()
        try:
            safefs.replace_file(fd, name, json.dumps(body).encode(), mode=0o600)
        finally:
            os.close(fd)
        entry.path = self.dir / name  # type: ignore[operator]
        return entry

    def pending(self) -> tuple[list[Spooled], list[str]]:
        """Entries left by an earlier run, oldest trial first; and the names set aside
        as unreadable."""
        if self.dir is None or not self.dir.is_dir():
            return [], []
        entries, bad = [], []
        fd = self._open()
        try:
            for path in sorted(self.dir.glob("trial-*.json")):
                entry = self._read(fd, path)
                if entry is None:
                    bad_name = path.with_suffix(".bad").name
                    os.rename(path.name, bad_name, src_dir_fd=fd, dst_dir_fd=fd)
                    bad.append(path.name)
                else:
                    entries.append(entry)
        finally:
            os.close(fd)
        entries.sort(key=lambda e: e.trial_id)
        return entries, bad

    @staticmethod
    def _read(fd: int, path: Path) -> Spooled | None:
        """The entry at `path` (in the spool `fd`), or None when it is not a readable one."""
        try:
            data = safefs.read_file(fd, path.name, MAX_ENTRY_BYTES, uid=os.geteuid())
            if data is None:
                return None
            body = json.loads(data)
            return Spooled(
                TrialReport.model_validate(body["report"]),
                str(body["runner_id"]),
                body.get("runner_secret"),
                path,
            )
        except (OSError, ValueError, KeyError, TypeError, ValidationError):
            return None
