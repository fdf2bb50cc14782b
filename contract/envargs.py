"""An environment's spec as uv's flags, and how two environments differ: what a runner passes
to uv and what a report shows (the install command, the changed packages) must agree, so both
sides read them here.
"""

from datetime import UTC, datetime, timedelta

from packaging.utils import canonicalize_name

from contract.wire import EnvSpec


def utc(when: datetime) -> datetime:
    """Naive means UTC."""
    return (when if when.tzinfo is not None else when.replace(tzinfo=UTC)).astimezone(UTC)


def exclude_newer_arg(when: datetime) -> str:
    """The ``--exclude-newer`` value that admits everything uploaded at or before `when`.

    uv keeps a file only when its upload time is strictly before the cutoff, in whole
    milliseconds, so the candidate's own upload time as cutoff would exclude the
    candidate. `EnvSpec.exclude_newer` means "nothing uploaded *after* this instant",
    hence the cutoff is `when`'s millisecond plus one.
    """
    cutoff = utc(when).replace(microsecond=utc(when).microsecond // 1000 * 1000)
    cutoff += timedelta(milliseconds=1)
    return cutoff.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def index_args(spec: EnvSpec) -> list[str]:
    """uv's index, find-links, pre-release and exclude-newer flags for `spec`."""
    args: list[str] = []
    if spec.index_url:
        args += ["--index-url", spec.index_url]
    for url in spec.extra_index_urls:
        args += ["--extra-index-url", url]
    for link in spec.find_links:
        args += ["--find-links", link]
    if spec.pre:
        args += ["--prerelease", "allow"]
    if spec.exclude_newer is not None:
        args += ["--exclude-newer", exclude_newer_arg(spec.exclude_newer)]
    return args


def freeze_diff(a: list[str], b: list[str]) -> list[tuple[str, str | None, str | None]]:
    """Packages whose versions differ between two freezes, sorted by name.

    Each row is ``(name, version in a, version in b)``; ``None`` where the
    package is absent. A direct reference (``name @ url``) counts the URL as
    its version.
    """
    pa, pb = _parse_freeze(a), _parse_freeze(b)
    rows = []
    for key in sorted(pa.keys() | pb.keys()):
        name_a, va = pa.get(key, (None, None))
        name_b, vb = pb.get(key, (None, None))
        if va != vb:
            rows.append((name_a or name_b or key, va, vb))
    return rows


def _parse_freeze(lines: list[str]) -> dict[str, tuple[str, str]]:
    out: dict[str, tuple[str, str]] = {}
    for raw in lines:
        line = raw.split(" #", 1)[0].strip()
        if not line or line.startswith(("#", "-")):
            continue
        if "==" in line:
            name, _, version = line.partition("==")
        elif " @ " in line:
            name, _, version = line.partition(" @ ")
        else:
            continue
        name = name.split("[", 1)[0].strip()
        out[canonicalize_name(name)] = (name, version.split(";", 1)[0].strip())
    return out
