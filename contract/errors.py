"""The one exception hierarchy of leakbisect.

Every error meant for a user derives from `LeakbisectError`; its ``str`` is one line, and
``field`` names the input to blame when there is one ("range", "index_url", ...). The kind
says what went wrong, and one table in each front end turns kinds into statuses:
HTTP in `service.http.errors`, exit statuses in `service.cli.errors`. Code raises the
kind that fits and never picks a status itself.

It lives in `runners` because the runners raise these too and must not import the service.
"""

from __future__ import annotations


class LeakbisectError(Exception):
    """An error with a one-line message for the user, optionally naming the input at fault.

    ``show_field_on_cli`` False: the CLI prints the message alone (it names the culprit).
    """

    show_field_on_cli = True

    def __init__(self, message: str, *, field: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.field = field

    def __str__(self) -> str:
        return self.message

    def detail(self) -> str:
        """``field: message`` when a field is to blame, else the message."""
        return f"{self.field}: {self.message}" if self.field else self.message


class InvalidInput(LeakbisectError, ValueError):
    """The request cannot be done as asked: a bad value, a range that does not exist."""


class NotFound(LeakbisectError, LookupError):
    """A job, trial or runner that does not exist."""


class Conflict(LeakbisectError):
    """The request clashes with the current state: a lease that is no longer yours,
    a job that has already finished."""


class Unauthenticated(LeakbisectError):
    """Who is asking is not known: no credential, or one that is not valid (an unknown
    token, a CI identity token refused for its signature, lifetime, audience or claims)."""


class Forbidden(LeakbisectError):
    """The caller is known but may not do this."""


class Unavailable(LeakbisectError):
    """Something the request needs is not there right now (a mechanism, a machine)."""


class LimitExceeded(LeakbisectError):
    """The caller is over a limit of the deployment (active jobs, queued trials): the same
    request may succeed later. ``retry_after_s``: when to try again, where that means
    something. The message names the limit and the setting that sets it."""

    def __init__(
        self, message: str, *, field: str | None = None, retry_after_s: int | None = None
    ) -> None:
        super().__init__(message, field=field)
        self.retry_after_s = retry_after_s


class TooLarge(LimitExceeded):
    """One request asks for more than a deployment allows at once (a range of too many
    releases): it will not succeed later as it is; asked smaller, it may."""


class InfrastructureFailure(Unavailable):
    """The machine under a trial failed (a Slurm node failed, the job was preempted or its
    node never booted): no outcome of the release, so the trial goes back to the queue
    without using an attempt."""
