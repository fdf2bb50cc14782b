"""What runs a trial: the `Executor` protocol the runner agent, `bisect-cli run`'s local
loop (service/local.py) and the executors themselves (runners/trial.py, runners/docker/)
agree on, so the service drives any executor without importing one.
"""

from collections.abc import Callable
from typing import Protocol

from contract.wire import Sample, TrialReport, TrialSpec

# Kills the running trial (a cancelled or stale lease); handed to the caller by `on_start`.
Kill = Callable[[], None]


class Executor(Protocol):
    """Runs trials. ``name`` is what runners register and reports show ("local", "docker")."""

    name: str

    def run_trial(
        self,
        spec: TrialSpec,
        *,
        on_sample: Callable[[Sample], None] | None = None,
        on_start: Callable[[Kill], None] | None = None,
        log: Callable[[str], None] | None = None,
    ) -> TrialReport: ...
