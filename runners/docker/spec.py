"""The containers of one trial, as docker SDK keyword arguments (pure: no engine needed).

A trial is two containers of the runner image, both labelled with the runner and the trial:

* **build** (``network_mode="host"``): ``python -m runners.docker.entry build|resolve``
  as the build user builds the candidate's environment with uv into the shared cache
  volume (``UV_CACHE_DIR``), or resolves its pins. Environments live in the cache volume
  (``/var/cache/leakbisect/envs``, so uv hard-links from its cache) unless an env volume
  is given (mounted at ``/envs``; ``UV_LINK_MODE=copy``, hard links cannot cross mounts).
* **run** (``network_mode="none"``, ``UV_OFFLINE=1``): the repro as the trial user under
  `runners.docker.entry`'s ``run``, with ``cap_drop=["ALL"]``, ``no-new-privileges``,
  ``pids_limit``, a read-only root (the script, its HOME and TMPDIR in a per-trial
  anonymous volume at ``/trial``; ``/tmp`` a small tmpfs), the volumes read-only, and the
  job's memory cap as ``mem_limit`` with ``memswap_limit`` equal to it (no swap to hide a
  leak in). A GPU trial gets exactly its GPU:
  ``DeviceRequest(device_ids=[uuid], capabilities=[["gpu", "compute", "utility"]])``.
  An attribute trial's ``run`` names its tracer and when it stops
  (``run PYTHON SCRIPT TRACER [MARKERS SECONDS]``).

The script's environment is `runners.sandbox.allowed_env` computed for the container
(its PATH, locale, the mounted CA bundle): never a ``BISECT_*`` variable, never a token.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from contract.wire import CommitRange, EnvSpec
from runners.kinds import handler
from runners.limits import DEFAULT_PIDS_LIMIT
from runners.publish import owner_key
from runners.sandbox import DEFAULT_PATH, allowed_env

BUILD_UID = 10001  # leakbisect-build in runner.Dockerfile
TRIAL_UID = 10002  # leakbisect-trial
CACHE_MOUNT = "/var/cache/leakbisect"
UV_CACHE = f"{CACHE_MOUNT}/uv"
GIT_CACHE = f"{CACHE_MOUNT}/git"  # blob-less clones of the repositories commits trials list
ENVS_IN_CACHE = f"{CACHE_MOUNT}/envs"
ENV_MOUNT = "/envs"
TRIAL_MOUNT = "/trial"
WORK = f"{TRIAL_MOUNT}/work"
CA_MOUNT = "/etc/leakbisect/host-ca.pem"
ENTRY_PYTHON = "/opt/leakbisect/.venv/bin/python"
LABEL_RUNNER = "leakbisect.runner"
LABEL_TRIAL = "leakbisect.trial"
LABEL_PHASE = "leakbisect.phase"
GPU_CAPABILITIES = [["gpu", "compute", "utility"]]
# Builds run third-party build backends: generous, but bounded, process counts.
BUILD_PIDS_LIMIT = 4096
TMPFS = "rw,nosuid,nodev,size=64m"


@dataclass(frozen=True)
class DockerSettings:
    """How this runner's trial containers are made."""

    image: str
    runner_name: str
    cache_volume: str = "leakbisect-cache"
    env_volume: str | None = None
    ca_bundle: str | None = None  # a host file: mounted read-only, SSL_CERT_FILE points at it
    pids_limit: int = DEFAULT_PIDS_LIMIT

    @property
    def env_root(self) -> str:
        return ENV_MOUNT if self.env_volume else ENVS_IN_CACHE


def labels(settings: DockerSettings, trial_id: int, attempt: int, phase: str) -> dict[str, str]:
    return {
        LABEL_RUNNER: settings.runner_name,
        LABEL_TRIAL: f"{trial_id}.{attempt}",
        LABEL_PHASE: phase,
    }


def owner_volume(name: str, owner: str | None) -> str:
    """An owner's own copy of volume `name`: a build container runs as the build uid, not
    root, so it cannot publish environments read-only (`runners.publish`) and a hostile
    build backend could rewrite every environment and cache entry in the volume it
    mounts. One volume per owner keeps what it can reach to its own owner's builds."""
    return name if owner is None else f"{name}-{owner_key(owner)}"


def _volumes(
    settings: DockerSettings, mode: str, owner: str | None
) -> dict[str, dict[str, str]]:
    vols = {owner_volume(settings.cache_volume, owner): {"bind": CACHE_MOUNT, "mode": mode}}
    if settings.env_volume:
        vols[owner_volume(settings.env_volume, owner)] = {"bind": ENV_MOUNT, "mode": mode}
    if settings.ca_bundle:
        vols[settings.ca_bundle] = {"bind": CA_MOUNT, "mode": "ro"}
    return vols


def _tls(settings: DockerSettings) -> dict[str, str]:
    if not settings.ca_bundle:
        return {}
    return {"SSL_CERT_FILE": CA_MOUNT, "UV_NATIVE_TLS": "1"}


def _hardening(pids_limit: int) -> dict[str, Any]:
    return {
        "cap_drop": ["ALL"],
        "security_opt": ["no-new-privileges"],
        "pids_limit": pids_limit,
        "read_only": True,
        "tmpfs": {"/tmp": TMPFS},
        "init": True,  # docker-init as PID 1 reaps what the script orphans
        "detach": True,
    }


def build_kwargs(
    settings: DockerSettings,
    trial_id: int,
    attempt: int,
    kind: str,
    env: EnvSpec,
    commit_range: CommitRange | None = None,
    owner: str | None = None,
) -> dict[str, Any]:
    """The build-phase container: host network, `owner`'s cache (and env) volume writable;
    it does `kind`'s build phase (`runners.kinds`) on `env` or `commit_range`."""
    environment = {
        "PATH": DEFAULT_PATH,
        "LANG": "C.UTF-8",
        "HOME": "/tmp",
        "UV_CACHE_DIR": UV_CACHE,
        **_tls(settings),
    }
    if settings.env_volume:
        environment["UV_LINK_MODE"] = "copy"
    handled = handler(kind)  # the entry's command is the kind's build phase
    given = handled.given(env, commit_range)
    command = [ENTRY_PYTHON, "-m", "runners.docker.entry", handled.phase.name, settings.env_root,
               "null" if given is None else given.model_dump_json()]  # fmt: skip
    return {
        "image": settings.image,
        "command": command,
        "user": f"{BUILD_UID}:{BUILD_UID}",
        "network_mode": "host",
        "environment": environment,
        "volumes": _volumes(settings, "rw", owner),
        "working_dir": "/tmp",
        "labels": labels(settings, trial_id, attempt, "build"),
        **_hardening(BUILD_PIDS_LIMIT),
    }


def script_env(settings: DockerSettings, variables: dict[str, str]) -> dict[str, str]:
    """The script's whole environment inside the run container (`allowed_env`)."""
    source = {"PATH": DEFAULT_PATH, "LANG": "C.UTF-8", **_tls(settings)}
    env = allowed_env(
        home=Path(f"{WORK}/home"),  # container paths: nothing here touches them
        tmpdir=Path(f"{WORK}/tmp"),
        variables=variables,
        source=source,
    )
    env["UV_OFFLINE"] = "1"
    return env


def gpu_request(uuids: list[str]) -> dict[str, Any]:
    """The DeviceRequest fields for exactly these GPUs (a bare [["gpu"]] or count=0: none)."""
    return {"device_ids": list(uuids), "capabilities": GPU_CAPABILITIES}


def run_kwargs(
    settings: DockerSettings,
    trial_id: int,
    attempt: int,
    *,
    python: str,
    script_name: str,
    memory_limit_bytes: int,
    variables: dict[str, str],
    gpu_uuids: list[str] | None = None,
    tracer: str | None = None,
    stop: Sequence[str] = (),
    owner: str | None = None,
) -> dict[str, Any]:
    """The run-phase container: no network, capped, unprivileged, read-only root; with
    `tracer`, the script runs under it (an attribute trial) until `stop`
    (`runners.tracing.stop_args`)."""
    from docker.types import DeviceRequest, Mount

    script = f"{WORK}/{script_name}"
    command = [ENTRY_PYTHON, "-m", "runners.docker.entry", "run", python, script]
    kwargs: dict[str, Any] = {
        "image": settings.image,
        "command": [*command, tracer, *stop] if tracer else command,
        "user": f"{TRIAL_UID}:{TRIAL_UID}",
        "network_mode": "none",
        "environment": script_env(settings, variables),
        "volumes": _volumes(settings, "ro", owner),
        "mounts": [Mount(target=TRIAL_MOUNT, source=None, type="volume")],
        "working_dir": TRIAL_MOUNT,
        "mem_limit": memory_limit_bytes,
        "memswap_limit": memory_limit_bytes,
        "labels": labels(settings, trial_id, attempt, "run"),
        **_hardening(settings.pids_limit),
    }
    if gpu_uuids:
        kwargs["device_requests"] = [DeviceRequest(**gpu_request(gpu_uuids))]
    return kwargs


def parse_result(logs: str) -> dict[str, Any] | None:
    """The JSON object `runners.docker.entry` prints as its last stdout line, or None."""
    for line in reversed(logs.strip().splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                value = json.loads(line)
            except ValueError:
                return None
            return value if isinstance(value, dict) else None
    return None
