"""One handler per trial kind: what a runner does for each `TrialKind`, registered once.

A trial has a *build phase* and, for the kinds that run a script, a *run phase*. Both
executors do the build phase with the same work (`Phase.work`): the local one in the
runner's process (`runners.trial`), the Docker one in a build container
(`runners.docker.entry`, started with the phase's name as its command); the work returns
JSON-ready data, which the container prints and the local executor reads as it is. The
run phase is the executor's own (`runners.executor`; the run container).

* ``run``: build (or reuse) the candidate's environment (`runners.envs.build_env`), then
  run the script in it under the cap and the sampler.
* ``attribute``: as ``run``, with the script under the allocation tracer `TrialSpec.trace`
  (`runners.tracing`: memray is added to the environment for it), which ends the run
  itself at `TrialSpec.trace_stop`, and the tracer's profile in `TrialReport.attribution`;
  memray that does not install is the profile's ``error``, not a failed trial.
* ``resolve``: no script; `runners.envs.resolve_pins` (``uv pip compile``, sandboxed as any
  build) and a report with ``pins``, or ``env.ok=False`` and ``env.error`` when the
  requirements cannot be resolved.

A failed build or resolution says why in ``env.failure`` (`contract.wire.Cause`:
`runners.uvrun.classify` for uv's failures, ``ENOSPC`` for the runner's own), in every
executor alike: the Docker executor's build container and a Slurm job run this same work.
* ``commits``: no script, no build; `runners.commits.answer` lists the commits of
  `TrialSpec.commit_range` (a blob-less clone cached in the git cache: `runners.gitcache`,
  `runners.gitrun`) into ``commits``, or says why in ``env.error``. It reads a repository
  (`Handler.reads_repo`): one only the runner's own file system holds cannot be listed
  in a container.

A handler says what the build phase is given (`Handler.given`), the tracer the script
runs under (`Handler.tracer`), and what the build phase's answer means
(`Handler.settle`): the trial's whole report (resolve, commits, a failed build) or
`Ready`, the environment the run phase runs the script in. `handler(kind)` is the one
look-up; a `TrialKind` without a handler fails at import.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from pydantic import BaseModel

from contract.wire import (
    CommitRange,
    EnvResult,
    EnvSpec,
    Failure,
    Tracer,
    TrialKind,
    TrialReport,
    TrialSpec,
    clip,
)
from runners import commits, tracing
from runners.envs import EnvError, build_env, resolve_pins

Log = Callable[[str], None]


@dataclass(frozen=True)
class Dirs:
    """Where the build phase works: environments, uv's cache, the git clones' cache."""

    env_root: Path
    uv_cache: Path
    git_cache: Path


@dataclass(frozen=True)
class Phase:
    """One build-phase work: ``name`` (the container entry's command), the model it is
    given, and the work itself (given, dirs, owner, log -> JSON-ready data)."""

    name: str
    given: type[BaseModel]
    work: Callable[[Any, Dirs, str | None, Log | None], dict[str, Any]]

    def parse(self, text: str) -> Any:
        """What the phase is given, from the JSON the container got (``null``: nothing)."""
        return None if text == "null" else self.given.model_validate_json(text)


def _build(env: EnvSpec, dirs: Dirs, owner: str | None, log: Log | None) -> dict[str, Any]:
    try:
        result = build_env(env, root=dirs.env_root, cache_dir=dirs.uv_cache, log=log, owner=owner)
    except EnvError as exc:
        result = EnvResult(ok=False, error=clip(str(exc)), failure=exc.failure)
    except OSError as exc:
        if (failure := Failure.from_exception(exc)) is None:
            raise
        result = EnvResult(ok=False, error=failure.message, failure=failure)
    return result.model_dump(mode="json")


def _resolve(env: EnvSpec, dirs: Dirs, owner: str | None, _log: Log | None) -> dict[str, Any]:
    started = time.monotonic()
    failure: Failure | None = None
    try:
        out: dict[str, Any] = {"pins": resolve_pins(env, cache_dir=dirs.uv_cache, owner=owner)}
    except EnvError as exc:
        out, failure = {"error": str(exc)}, exc.failure
    except OSError as exc:
        if (failure := Failure.from_exception(exc)) is None:
            raise
        out = {"error": failure.message}
    if failure is not None:
        out["failure"] = failure.model_dump(mode="json")
    return out | {"seconds": round(time.monotonic() - started, 3)}


def _commits(
    commit_range: CommitRange | None, dirs: Dirs, _owner: str | None, _log: Log | None
) -> dict[str, Any]:
    return commits.answer(commit_range, dirs.git_cache)


BUILD = Phase("build", EnvSpec, _build)
RESOLVE = Phase("resolve", EnvSpec, _resolve)
COMMITS = Phase("commits", CommitRange, _commits)


@dataclass(frozen=True)
class Ready:
    """A built environment the script runs in, under ``tracer`` when it is one."""

    env: EnvResult
    python: str
    tracer: Tracer | None


def built_env(answer: dict[str, Any]) -> EnvResult:
    """The build phase's `EnvResult`, or a failed one from an answer that is none (with
    the answer's `Failure`, where it says one: a resolution an index's error stopped)."""
    if "ok" in answer:
        return EnvResult.model_validate(answer)
    said = answer.get("failure")
    failure = None if said is None else Failure.model_validate(said)
    return EnvResult(ok=False, error=clip(str(answer.get("error") or "build failed")),
                     seconds=float(answer.get("seconds") or 0.0), failure=failure)  # fmt: skip


def _report(spec: TrialSpec, env: EnvResult, **fields: Any) -> TrialReport:
    return TrialReport(trial_id=spec.trial_id, attempt=spec.attempt, env=env, **fields)


class Handler:
    """What the runner does for one kind (see the module docstring); the base is a kind
    that builds `TrialSpec.env` and runs the script in it."""

    kind: ClassVar[TrialKind]
    phase: ClassVar[Phase] = BUILD
    runs_script: ClassVar[bool] = True
    reads_repo: ClassVar[bool] = False

    def tracer(self, spec: TrialSpec) -> Tracer | None:
        return None

    def env(self, spec: TrialSpec) -> EnvSpec:
        """The environment the build phase builds or resolves."""
        return tracing.traced_env(spec.env, self.tracer(spec))

    def given(self, env: EnvSpec, commit_range: CommitRange | None) -> BaseModel | None:
        """What the build phase is given (`env` as `Handler.env` made it)."""
        return env

    def settle(self, spec: TrialSpec, answer: dict[str, Any]) -> TrialReport | Ready:
        env = built_env(answer)
        tracer = self.tracer(spec)
        if env.ok and env.python_executable is not None:
            return Ready(env, env.python_executable, tracer)
        profile = None if env.ok else tracing.failed_build(tracer, env)
        return _report(spec, env, attribution=profile)


class _Run(Handler):
    kind = TrialKind.RUN


class _Attribute(Handler):
    kind = TrialKind.ATTRIBUTE

    def tracer(self, spec: TrialSpec) -> Tracer | None:
        return spec.trace


class _Resolve(Handler):
    kind = TrialKind.RESOLVE
    phase = RESOLVE
    runs_script = False

    def settle(self, spec: TrialSpec, answer: dict[str, Any]) -> TrialReport | Ready:
        seconds = float(answer.get("seconds") or 0.0)
        if isinstance(answer.get("pins"), list):
            pins = [str(p) for p in answer["pins"]]
            return _report(spec, EnvResult(ok=True, seconds=seconds), pins=pins)
        return _report(spec, built_env(answer))


class _Commits(Handler):
    kind = TrialKind.COMMITS
    phase = COMMITS
    runs_script = False
    reads_repo = True

    def given(self, env: EnvSpec, commit_range: CommitRange | None) -> BaseModel | None:
        return commit_range

    def settle(self, spec: TrialSpec, answer: dict[str, Any]) -> TrialReport | Ready:
        return commits.report(spec, answer)


HANDLERS: dict[TrialKind, Handler] = {h.kind: h for h in (_Run(), _Attribute(), _Resolve(),
                                                          _Commits())}  # fmt: skip
PHASES: dict[str, Phase] = {h.phase.name: h.phase for h in HANDLERS.values()}
if set(HANDLERS) != set(TrialKind):  # a new kind gets its handler here, or nothing starts
    raise ImportError(f"runners.kinds: no handler for {set(TrialKind) - set(HANDLERS)}")


def handler(kind: TrialKind | str) -> Handler:
    """The handler of `kind` (`ValueError` for a name that is no `TrialKind`)."""
    return HANDLERS[TrialKind(kind)]
