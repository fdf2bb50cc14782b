"""The Docker executor: every trial in containers of the runner image (docker SDK).

Same interface as the local executor (`runners.trial.Executor`). Per trial
(`runners.docker.spec` has the exact container settings):

1. a **build** container (host network, the owner's uv cache volume) does the build phase
   of the trial's kind with `runners.docker.entry` (`runners.kinds`: build or reuse the
   candidate's environment, resolve its pins, or list commits, its clones kept in the
   cache volume) and prints its answer;
2. a **run** container (no network, unprivileged, no capabilities, pids limit, read-only
   root, ``mem_limit`` = ``memswap_limit`` = the job's cap) runs the script, which is put
   into its per-trial volume before it starts; `runners.docker.watch` samples its cgroup
   and reads the verdict of the kernel's OOM killer before the container goes.

A kind that runs no script has only the build container; one that reads a repository
(`runners.kinds.Handler.reads_repo`) is refused a local clone before any container starts.

Under the kind's tracer (an attribute trial, `runners.tracing`) the build container builds
the traced environment (memray added for the memray tracer; when it does not install, the
report's ``attribution`` says so), and the executor puts the tracer's helper into the
run container's volume beside the script (the trial user's, as the script is), runs the
script under it, and copies the profile the helper wrote out of the stopped container (at
most `runners.tracing.MAX_PROFILE_BYTES`) into ``attribution``, read as the local
executor reads it.

Each container is removed (with its anonymous volume) once its output and state are read.
Containers carry the labels ``leakbisect.runner`` and ``leakbisect.trial``; a starting
executor removes every container labelled with its runner name (left by a runner that was
SIGKILLed), and ``kill`` (a cancelled or stale trial, a stopping runner) kills the
trial's current container, which ends the trial as killed.
"""

from __future__ import annotations

import contextlib
import io
import os
import tarfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from contract.errors import InvalidInput, Unavailable
from contract.executor import Kill
from contract.wire import Sample, TrialReport, TrialSpec, clip
from runners import commits, tracing
from runners.docker.cgroup import DEFAULT_ROOT
from runners.docker.spec import (
    LABEL_RUNNER,
    TRIAL_UID,
    WORK,
    DockerSettings,
    build_kwargs,
    parse_result,
    run_kwargs,
)
from runners.docker.watch import RunArgs, Watch, watch
from runners.envs import INSTALL_TIMEOUT_S
from runners.kinds import Handler, built_env, handler
from runners.limits import default_limit_bytes
from runners.nvml import GpuProbe
from runners.sandbox import check_variables
from runners.trial import _report
from runners.watch import Execution

DEFAULT_IMAGE = "leakbisect-runner:latest"
IMAGE_ENV = "BISECT_RUNNER_IMAGE"
DEFAULT_CACHE_VOLUME = "leakbisect-cache"
BUILD_HINT = "build it with dockerfiles/build-base.sh && uv run python -m runners.docker.images"
LOCAL_CLONE = ("--repo: a local clone is not visible in the runner's containers; use "
               "--executor local, or serve it over http(s)")  # fmt: skip
# The tar around a profile copied out of a container: its headers and padding.
TAR_SLACK = 64 * 1024


def _engine() -> Any:
    """A client of the local engine, or `Unavailable` in one line."""
    try:
        import docker
        from docker.errors import DockerException
    except ImportError as exc:  # pragma: no cover - docker is a dependency
        raise Unavailable(f"the docker SDK is not installed: {exc}") from None
    try:
        client = docker.from_env()
        client.ping()
    except DockerException as exc:
        reason = str(exc).splitlines()[0][:200]
        raise Unavailable(f"--executor docker: no Docker engine reachable ({reason})") from None
    return client


class _TrialKill:
    """Kills whichever container the trial is in now; later phases then do not start."""

    def __init__(self) -> None:
        self.killed = False
        self.container: Any = None
        self.watch: Watch | None = None
        self._lock = threading.Lock()

    def current(self, container: Any, w: Watch | None = None) -> None:
        with self._lock:
            self.container, self.watch = container, w
            if self.killed:
                self._kill()

    def _kill(self) -> None:
        if self.watch is not None:
            self.watch.killed = True
            self.watch.done.set()
        if self.container is not None:
            with contextlib.suppress(Exception):  # already gone
                self.container.kill()

    def __call__(self) -> None:
        with self._lock:
            self.killed = True
            self._kill()


class DockerExecutor:
    """Trials in containers (see the module docstring)."""

    name = "docker"

    def __init__(
        self,
        client: Any,
        settings: DockerSettings,
        gpu: GpuProbe | None = None,
        cgroup_root: Path = DEFAULT_ROOT,
    ) -> None:
        self.client = client
        self.settings = settings
        self.gpu = gpu
        self.cgroup_root = Path(cgroup_root)

    @classmethod
    def from_env(
        cls,
        *,
        runner_name: str,
        image: str | None = None,
        cache_volume: str = DEFAULT_CACHE_VOLUME,
        env_volume: str | None = None,
        gpu: GpuProbe | None = None,
        cgroup_root: Path = DEFAULT_ROOT,
    ) -> DockerExecutor:
        """Connect to the engine, check the image, remove this runner's leftovers."""
        from docker.errors import ImageNotFound

        client = _engine()
        image = image or os.environ.get(IMAGE_ENV) or DEFAULT_IMAGE
        try:
            client.images.get(image)
        except ImageNotFound:
            raise Unavailable(f"--image: runner image {image} not found; {BUILD_HINT}") from None
        if (
            not (Path(cgroup_root) / "memory").is_dir()
            and not (Path(cgroup_root) / "cgroup.controllers").exists()
        ):
            raise Unavailable(f"--cgroup-root: {cgroup_root} is not a cgroup v1 or v2 mount")
        ca = os.environ.get("SSL_CERT_FILE")
        settings = DockerSettings(
            image=image,
            runner_name=runner_name,
            cache_volume=cache_volume,
            env_volume=env_volume,
            ca_bundle=ca if ca and Path(ca).is_file() else None,
        )
        executor = cls(client, settings, gpu, cgroup_root)
        executor.remove_leftovers()
        return executor

    def leftovers(self) -> list[Any]:
        label = f"{LABEL_RUNNER}={self.settings.runner_name}"
        return self.client.containers.list(all=True, filters={"label": label})

    def remove_leftovers(self) -> int:
        """Remove every container of this runner's name (a killed runner's trials)."""
        gone = 0
        for container in self.leftovers():
            _remove(container)
            gone += 1
        return gone

    # -- a trial

    def run_trial(
        self,
        spec: TrialSpec,
        *,
        on_sample: Callable[[Sample], None] | None = None,
        on_start: Callable[[Kill], None] | None = None,
        log: Callable[[str], None] | None = None,
    ) -> TrialReport:
        kill = _TrialKill()
        if on_start is not None:
            on_start(kill)
        kind = handler(spec.kind)
        if kind.reads_repo and _local_clone(spec):  # refused before any container starts
            answer: dict[str, Any] = {"error": LOCAL_CLONE}
        else:
            answer = self._build(spec, kind, kill, log)
        if kind.runs_script and kill.killed:
            return TrialReport(trial_id=spec.trial_id, attempt=spec.attempt,
                               env=built_env(answer), error="killed")  # fmt: skip
        ready = kind.settle(spec, answer)
        if isinstance(ready, TrialReport):
            return ready
        try:
            run, profile = self._run(spec, ready.python, kill, on_sample, ready.tracer)
        except InvalidInput as exc:  # a BISECT_* variable: nothing ran
            return TrialReport(
                trial_id=spec.trial_id,
                attempt=spec.attempt,
                env=ready.env,
                error=clip(exc.detail()),
            )
        return _report(spec, ready.env, run).model_copy(update={"attribution": profile})

    def _build(
        self, spec: TrialSpec, kind: Handler, kill: _TrialKill, log: Callable[[str], None] | None
    ) -> dict[str, Any]:
        """The build container's JSON answer (the kind's `runners.kinds.Phase` work), or an
        error."""
        started = time.monotonic()
        kwargs = build_kwargs(self.settings, spec.trial_id, spec.attempt, kind.kind,
                              kind.env(spec), spec.commit_range, owner=spec.owner)  # fmt: skip
        container = self.client.containers.run(**kwargs)
        kill.current(container)
        try:
            try:
                container.wait(timeout=INSTALL_TIMEOUT_S)
            except Exception:  # noqa: BLE001 - a timeout: kill it, report below
                container.kill()
            out = container.logs(stdout=True, stderr=False).decode("utf-8", "replace")
            err = container.logs(stdout=False, stderr=True).decode("utf-8", "replace")
        finally:
            _remove(container)
        if log is not None:
            for line in err.splitlines()[-50:]:
                log(line)
        result = parse_result(out)
        if result is None:
            tail = err.strip().splitlines()[-5:]
            reason = "killed" if kill.killed else "; ".join(tail) or "no output"
            return {"error": f"build container: {reason}",
                    "seconds": round(time.monotonic() - started, 3)}  # fmt: skip
        return result

    def _gpu_uuids(self) -> list[str]:
        if self.gpu is None:
            return []
        return [d["uuid"] for d in self.gpu.describe()["devices"] if d.get("uuid")]

    def _run(
        self,
        spec: TrialSpec,
        python: str,
        kill: _TrialKill,
        on_sample: Callable[[Sample], None] | None,
        tracer: str | None = None,
    ) -> tuple[Execution, dict[str, Any] | None]:
        """The run container to its end; with `tracer`, the profile it left (or why none)."""
        check_variables(spec.variables)
        limit = spec.memory_limit_bytes or default_limit_bytes()
        name = Path(spec.script_name).name or "repro.py"
        kwargs = run_kwargs(
            self.settings, spec.trial_id, spec.attempt, python=python, script_name=name,
            memory_limit_bytes=limit, variables=spec.variables,
            gpu_uuids=self._gpu_uuids() if spec.requires_gpu else None, tracer=tracer,
            stop=tracing.stop_args(spec.trace_stop), owner=spec.owner,
        )  # fmt: skip
        kwargs.pop("detach")
        container = self.client.containers.create(**kwargs)
        try:
            helper = tracing.helper_source() if tracer else None
            container.put_archive("/trial", _trial_tar(name, spec.script, helper))
            w = Watch()
            kill.current(container, w)
            container.start()
            t0 = time.monotonic()
            args = RunArgs(spec.timeout_s, spec.sample_hz, limit, self.cgroup_root,
                           self.gpu, on_sample, spec.early_stop)  # fmt: skip
            run = watch(container, args, w, t0)
            return run, (_profile(container) if tracer else None)
        finally:
            kill.current(None)
            _remove(container)


def _trial_tar(name: str, script: str, helper: str | None = None) -> io.BytesIO:
    """work/ (0700), work/home, work/tmp and work/<script> (with `helper`, also
    work/<`tracing.HELPER_NAME`>), all the trial user's."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for d in ("work", "work/home", "work/tmp"):
            info = tarfile.TarInfo(d)
            info.type, info.mode, info.uid, info.gid = tarfile.DIRTYPE, 0o700, TRIAL_UID, TRIAL_UID
            tar.addfile(info)
        files = [(name, script)] + ([(tracing.HELPER_NAME, helper)] if helper is not None else [])
        for file_name, text in files:
            data = text.encode()
            info = tarfile.TarInfo(f"work/{file_name}")
            info.size, info.mode, info.uid, info.gid = len(data), 0o600, TRIAL_UID, TRIAL_UID
            tar.addfile(info, io.BytesIO(data))
    buf.seek(0)
    return buf


def _profile(container: Any) -> dict[str, Any]:
    """The profile the helper wrote in the (stopped) run container, read as
    `tracing.read_profile` reads a file: no file, one past the cap, or not JSON is an error."""
    from docker.errors import NotFound

    try:
        stream, stat = container.get_archive(f"{WORK}/{tracing.PROFILE_NAME}")
    except NotFound:
        return tracing.parse_profile(None)
    except Exception as exc:  # noqa: BLE001 - the engine's error, in the profile
        return {"error": f"the profile could not be read: {str(exc)[:300]}"}
    size = int(stat.get("size") or 0)
    if size > tracing.MAX_PROFILE_BYTES:
        return tracing.parse_profile(b"", size)
    buf = bytearray()
    for chunk in stream:
        buf += chunk
        if len(buf) > tracing.MAX_PROFILE_BYTES + TAR_SLACK:  # not the file stat said
            stream.close()
            return {"error": "the profile could not be read: it is not a plain file"}
    try:
        with tarfile.open(fileobj=io.BytesIO(bytes(buf))) as tar:
            member = tar.next()
            if member is None or not member.isfile():
                return {"error": "the profile could not be read: it is not a plain file"}
            f = tar.extractfile(member)
            data = f.read(tracing.MAX_PROFILE_BYTES + 1) if f is not None else b""
    except (tarfile.TarError, OSError) as exc:
        return {"error": f"the profile could not be read: {exc}"}
    return tracing.parse_profile(data)


def _remove(container: Any) -> None:
    with contextlib.suppress(Exception):  # already removed
        container.remove(force=True, v=True)


def _local_clone(spec: TrialSpec) -> bool:
    repo = spec.commit_range.repo if spec.commit_range else ""
    return bool(repo) and (not commits.is_url(repo) or repo.startswith("file:"))
