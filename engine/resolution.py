"""As of when the other packages of a job are resolved: the policy. Pure: no I/O.

A repro needs more than the bisected package (`--with jax`), and those co-dependencies
must look like the environment the user had. Resolving them against today's index puts
a 2026 jax next to a 2024 orbax, and the good bound then crashes on import. So the job's
pins (resolved once, on a runner, for the good bound: service/pins.py) are resolved
*as of* an instant, and every candidate is built with them as constraints.

Rules, in order:

1. `--as-released`: no shared pins; each candidate is resolved as on its own upload day.
2. `--resolve-at latest`: the pins are resolved against the index as it is today.
3. `--resolve-at DATE`: as of the end of that day (UTC), or of the instant given with a
   time. A date before the good bound was uploaded is refused: the good bound itself
   would not exist yet.
4. The default: as of the upload time of the range's newest release (the bad bound;
   with `--find-fix`, the fixed one). Every candidate existed then, and the user's
   environment, which ran the newest release, was most likely from about then.
5. The newest release has no upload time (find-links, an index without PEP 700): as
   in 2, and the report says so.

Where the pins do not fit a candidate, that candidate is resolved freely and its row
says so (runners/envs.py). `--base-env FILE` replaces this policy: the user's file is the
pins (engine/baseenv.py). Which policy a job has, and which options refuse each other, is
service/envpolicy.py's (its `ResolvedAt` and `AsReleased` call the functions here).
"""

from datetime import UTC, date, datetime, time, timedelta

from contract.errors import InvalidInput

LATEST = "latest"


def parse_resolve_at(value: str) -> datetime | None:
    """`latest` -> None; `YYYY-MM-DD` -> the end of that day (UTC); an ISO time -> itself."""
    text = value.strip()
    if text.lower() == LATEST:
        return None
    try:
        if len(text) == 10:
            day = date.fromisoformat(text)
            return datetime.combine(day + timedelta(days=1), time(), UTC) - timedelta(
                microseconds=1
            )
        when = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise InvalidInput(
            f"{value!r} is not a date: write YYYY-MM-DD, an ISO 8601 time, or latest",
            field="resolve_at",
        ) from None
    return when if when.tzinfo is not None else when.replace(tzinfo=UTC)


def pins_as_of(
    *,
    as_released: bool,
    resolve_at: str | None,
    good: tuple[str, datetime | None],
    newest: tuple[str, datetime | None],
) -> datetime | None:
    """The instant the pins are resolved as of (None: today's index, or no shared pins).

    `good` and `newest` are (version, upload time) of the range's ends.
    """
    if as_released:
        return None
    if resolve_at is not None:
        when = parse_resolve_at(resolve_at)
        good_version, good_uploaded = good
        if when is not None and good_uploaded is not None and when < _utc(good_uploaded):
            raise InvalidInput(
                f"{resolve_at} is before the good bound {good_version} was uploaded "
                f"({_utc(good_uploaded):%Y-%m-%d}): it could not be resolved",
                field="resolve_at",
            )
        return when
    _version, uploaded = newest
    return _utc(uploaded) if uploaded is not None else None


def describe(
    *,
    as_released: bool,
    resolve_at: str | None,
    as_of: datetime | None,
    newest: str,
    find_fix: bool = False,
) -> str:
    """The report's "environment" line: how the other packages were chosen, and why."""
    if as_released:
        return "each candidate resolved as on its own upload day (--as-released)"
    held = "other packages held at the versions resolved for the good bound"
    if resolve_at is not None and as_of is None:
        return f"{held} against today's index (--resolve-at latest)"
    if resolve_at is not None:
        return f"{held} as of {_shown(as_of)} (--resolve-at {resolve_at})"
    role = "the fixed bound" if find_fix else "the bad bound"
    if as_of is None:
        return (
            f"{held} against today's index: {newest} ({role}) has no upload time on the "
            "index (--resolve-at DATE to choose one)"
        )
    return (
        f"{held} as of {_shown(as_of)}, when {newest} ({role}) was uploaded, so none is "
        "newer than the range (--resolve-at DATE|latest or --as-released to change)"
    )


def _utc(when: datetime) -> datetime:
    return when if when.tzinfo is not None else when.replace(tzinfo=UTC)


def _shown(when: datetime | None) -> str:
    assert when is not None
    return _utc(when).astimezone(UTC).strftime("%Y-%m-%d %H:%M UTC")
