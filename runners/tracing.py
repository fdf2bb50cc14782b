"""The runner's side of an attribute trial: the tracer's environment, helper and profile.

An attribute trial runs the script as `runners/tracehelper.py` says, under the same cap,
sampler and sandbox as any run. The helper is copied into the trial's private directory
beside the script (the trial's interpreter cannot import leakbisect); memray is added to
the trial's environment only (a separate environment, never the user's), and when it
does not install the trial still ends, with the reason as its profile's ``error``.
`TrialSpec.trace_stop` reaches the helper as its ``MARKERS SECONDS`` arguments
(`stop_args`): the helper ends the traced run itself and still writes its profile.

The profile is written by the trial user in a directory it owns: root reads it only
through `runners.safefs` (`read_profile`), never following a link, never opening a FIFO
or a device, never reading past `MAX_PROFILE_BYTES`.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from contract.wire import EnvResult, EnvSpec, Tracer, TraceStop
from runners import safefs

MEMRAY_REQUIREMENT = "memray"
HELPER_NAME = ".leakbisect-trace.py"
PROFILE_NAME = ".leakbisect-profile.json"
MAX_PROFILE_BYTES = 4 * 1024 * 1024


def helper_source() -> str:
    return (Path(__file__).parent / "tracehelper.py").read_text()


def helper_args(
    tracer: Tracer | str, profile: Path, script: Path, stop: Sequence[str] = ()
) -> list[str]:
    """What follows the helper on the command line: ``TRACER OUT SCRIPT [MARKERS SECONDS]``."""
    return [tracer, str(profile), str(script), *stop]


def stop_args(stop: TraceStop | None) -> list[str]:
    """``MARKERS SECONDS`` for the helper (0: no such limit); [] when nothing stops it."""
    if stop is None or (stop.markers is None and stop.seconds is None):
        return []
    return [str(stop.markers or 0), repr(float(stop.seconds or 0))]


def traced_env(env: EnvSpec, tracer: Tracer | None) -> EnvSpec:
    """The environment a trial builds: its own, plus memray under the memray tracer (the
    tracer is the trial kind's: `runners.kinds`)."""
    if tracer != "memray":
        return env
    return env.model_copy(update={"requirements": [*env.requirements, MEMRAY_REQUIREMENT]})


def failed_build(tracer: Tracer | None, env: EnvResult) -> dict[str, Any] | None:
    """The profile of a trial whose environment did not build: memray's install said why."""
    return not_installed("memray", env.error) if tracer == "memray" else None


def read_profile(path: Path, *, uid: int | None = None) -> dict[str, Any]:
    """The profile the helper wrote, or ``{"error": why}``; never more than the cap.

    The trial user owns the directory and may have put anything at `path`: it is read
    through `runners.safefs.read_path` (a regular file with one link, owned by `uid` when
    given, at most `MAX_PROFILE_BYTES`); a link, a FIFO, a device or a file too large is
    the profile's one-line error, not a failed trial (and nothing blocks)."""
    try:
        return parse_profile(safefs.read_path(path, MAX_PROFILE_BYTES, uid=uid))
    except safefs.TooLarge as exc:
        return parse_profile(None, exc.size)
    except OSError as exc:  # UnsafePath included: its message names the file and why
        return {"error": f"the profile could not be read: {exc}"}


def parse_profile(data: bytes | None, size: int | None = None) -> dict[str, Any]:
    """The profile in `data`, or ``{"error": why}``: None with no `size` when there was no
    file; `size` its length when `data` was not read (None) or read only up to the cap."""
    size = len(data) if size is None and data is not None else size
    if size is not None and size > MAX_PROFILE_BYTES:
        return {"error": f"the profile is {size} bytes; at most {MAX_PROFILE_BYTES}"}
    if data is None:
        return {"error": "the traced run wrote no profile (it was killed or exited early)"}
    try:
        parsed = json.loads(data)
    except ValueError as exc:
        return {"error": f"the profile could not be read: {exc}"}
    return parsed if isinstance(parsed, dict) else {"error": "the profile is not an object"}


def not_installed(tracer: Tracer, error: str | None) -> dict[str, Any]:
    """The profile of a trial whose tracer did not install: uv's line that names it."""
    lines = [line.strip() for line in (error or "").splitlines() if line.strip()]
    named = [line for line in lines if tracer in line] or lines or ["no reason given"]
    return {"tracer": tracer, "error": f"{tracer} did not install: {named[0][:300]}"}
