"""What runs inside a trial's containers (the Docker executor's side of the wall).

    python -m runners.docker.entry build ENV_ROOT SPEC_JSON     (build phase, host network)
    python -m runners.docker.entry resolve ENV_ROOT SPEC_JSON   (build phase)
    python -m runners.docker.entry commits ENV_ROOT RANGE_JSON  (build phase, host network)
    python -m runners.docker.entry run PYTHON SCRIPT            (run phase, no network)
    python -m runners.docker.entry run PYTHON SCRIPT TRACER [MARKERS SECONDS]
                                                                (run phase, attribute trial)

``build``, ``resolve`` and ``commits`` are the build phases of the trial kinds
(`runners.kinds.PHASES`, the same work the local executor does): ``build`` builds (or
reuses) the candidate's environment under ENV_ROOT with uv (`runners.envs.build_env`) and
prints the `EnvResult` as one JSON line on stdout; uv's progress goes to stderr.
``resolve`` prints ``{"pins": [...], "seconds": S}`` or ``{"error": "...", "seconds": S}``;
``commits`` lists the commits into the cache volume's clones (`runners.commits.answer`).

``run`` runs ``PYTHON SCRIPT`` in the script's directory with this process's environment
(the container's, already the allowlist), forwards SIGTERM/SIGINT to it, and when it ends
prints ``::leakbisect-exit:: CODE`` on stderr (negative: killed by that signal) and waits
up to `HOLD_S` seconds for the agent to stop the container: the agent reads the cgroup's
``oom_kill`` counter while the cgroup still exists (it is removed with the container, and
``State.OOMKilled`` alone is unreliable).

With TRACER (``memray`` or ``tracemalloc``: an attribute trial) ``run`` runs
``PYTHON HELPER TRACER PROFILE SCRIPT [MARKERS SECONDS]`` instead (the helper ends the
traced run itself at MARKERS step markers or SECONDS: `runners.tracing.stop_args`),
where HELPER (`runners.tracing.HELPER_NAME`,
the agent's copy of `runners/tracehelper.py`) and PROFILE (`runners.tracing.PROFILE_NAME`,
which the helper writes) are in the script's directory; the agent copies PROFILE out of
the stopped container.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from runners.kinds import Phase

EXIT_MARKER = "::leakbisect-exit::"
HOLD_S = 30.0
# `contract.wire.TRACERS`, spelled out: the run phase stays off pydantic until it traces.
TRACERS = ("memray", "tracemalloc")


def _build(phase: Phase, env_root: str, given_json: str) -> int:
    """One trial kind's build phase (`runners.kinds.Phase`): its answer as one JSON line."""
    from runners.docker.spec import GIT_CACHE, UV_CACHE
    from runners.kinds import Dirs

    def log(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    dirs = Dirs(env_root=Path(env_root), uv_cache=Path(UV_CACHE), git_cache=Path(GIT_CACHE))
    print(json.dumps(phase.work(phase.parse(given_json), dirs, None, log)), flush=True)
    return 0


def _run(python: str, script: str, tracer: str | None = None, stop: list[str] | None = None) -> int:
    command = [python, script]
    if tracer is not None:
        from runners import tracing

        work = Path(script).parent
        args = tracing.helper_args(tracer, work / tracing.PROFILE_NAME, Path(script), stop or [])
        command = [python, str(work / tracing.HELPER_NAME), *args]
    child = subprocess.Popen(command, cwd=str(Path(script).parent))

    def forward(signum: int, _frame: object) -> None:
        if child.poll() is None:
            child.send_signal(signum)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    code = child.wait()
    print(f"{EXIT_MARKER} {code}", file=sys.stderr, flush=True)
    time.sleep(HOLD_S)  # the agent stops the container once it has read the counters
    return 0


def main(argv: list[str]) -> int:
    if len(argv) == 3 and argv[0] != "run":
        # Imported here: the run phase stays off pydantic (its memory is the trial's).
        from runners.kinds import PHASES

        if argv[0] in PHASES:
            return _build(PHASES[argv[0]], argv[1], argv[2])
    if len(argv) == 3 and argv[0] == "run":
        return _run(argv[1], argv[2])
    if len(argv) in (4, 6) and argv[0] == "run" and argv[3] in TRACERS:
        return _run(argv[1], argv[2], argv[3], argv[4:])
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
