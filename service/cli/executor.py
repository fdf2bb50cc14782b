"""The executor options of `run`, `runner` and `serve`, and the one place executors are made.

``--executor local`` (the default: trials as sandboxed child processes), ``docker``
(every trial in containers of ``--image``: `runners.docker.executor`) or ``slurm`` (every
trial one job of the Slurm cluster this machine submits to, its files under ``--slurm-dir``:
`runners.slurm.executor`). `with_executor_options`
adds the flags to a command; the command then calls `make_executor`, which fails in one
line (exit status of `Unavailable`, `service.cli.errors`) when the engine or the image is
missing.
"""

from __future__ import annotations

import contextvars
import functools
import inspect
import sys
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer

from contract.errors import InvalidInput, Unavailable
from contract.executor import Executor
from runners.docker.cgroup import DEFAULT_ROOT
from runners.docker.executor import DEFAULT_CACHE_VOLUME, DEFAULT_IMAGE, IMAGE_ENV
from runners.nvml import GpuProbe
from runners.slurm.batch import DEFAULT_BUILD_MINUTES, SlurmOptions
from runners.trial import LocalExecutor
from service.cli.errors import exit_status, fail
from service.options import EXECUTOR
from service.settings import Settings

F = TypeVar("F", bound=Callable[..., Any])


class ExecutorKind(StrEnum):
    local = "local"
    docker = "docker"
    slurm = "slurm"


@dataclass(frozen=True)
class ExecutorChoice:
    kind: ExecutorKind = ExecutorKind.local
    image: str = DEFAULT_IMAGE
    cache_volume: str = DEFAULT_CACHE_VOLUME
    env_volume: str | None = None
    cgroup_root: Path = DEFAULT_ROOT
    slurm_dir: Path | None = None
    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    build_minutes: int = DEFAULT_BUILD_MINUTES


_CHOICE: contextvars.ContextVar[ExecutorChoice | None] = contextvars.ContextVar(
    "executor_choice", default=None
)

_PARAMS: dict[str, tuple[Any, Any]] = {
    "executor": (
        Annotated[ExecutorKind, typer.Option(
            "--executor", envvar="BISECT_EXECUTOR", case_sensitive=False,
            rich_help_panel=EXECUTOR,
            help="Where trials run: local (sandboxed child processes), docker (one "
            "container per phase of each trial, from --image; needs a Docker engine) or "
            "slurm (one Slurm job per trial; needs --slurm-dir).",
        )],
        ExecutorKind.local,
    ),
    "image": (
        Annotated[str, typer.Option(
            "--image", envvar=IMAGE_ENV,
            metavar="IMAGE", rich_help_panel=EXECUTOR,
            help="Runner image of --executor docker (dockerfiles/runner.Dockerfile).",
        )],
        DEFAULT_IMAGE,
    ),
    "cache_volume": (
        Annotated[str, typer.Option(
            "--cache-volume", envvar="BISECT_CACHE_VOLUME",
            metavar="VOLUME", rich_help_panel=EXECUTOR,
            help="Docker volume of the shared uv cache (and of the environments unless "
            "--env-volume).",
        )],
        DEFAULT_CACHE_VOLUME,
    ),
    "env_volume": (
        Annotated[str | None, typer.Option(
            "--env-volume", envvar="BISECT_ENV_VOLUME", show_default=False,
            metavar="VOLUME", rich_help_panel=EXECUTOR,
            help="Docker volume for the environments, apart from the uv cache (uv then "
            "copies instead of hard-linking).",
        )],
        None,
    ),
    "cgroup_root": (
        Annotated[Path, typer.Option(
            "--cgroup-root", envvar="BISECT_CGROUP_ROOT",
            metavar="DIR", rich_help_panel=EXECUTOR,
            help="The host's cgroup tree as this process sees it (mount it there when the "
            "runner itself runs in a container); trial containers are sampled from it.",
        )],
        DEFAULT_ROOT,
    ),
    "slurm_dir": (
        Annotated[Path | None, typer.Option(
            "--slurm-dir", envvar="BISECT_SLURM_DIR", show_default=False,
            metavar="DIR", rich_help_panel=EXECUTOR,
            help="--executor slurm: a directory every compute node sees at the same path; "
            "the trials' files, the uv cache and the environments go under it.",
        )],
        None,
    ),
    "partition": (
        Annotated[str | None, typer.Option(
            "--partition", envvar="BISECT_SLURM_PARTITION", show_default=False,
            metavar="NAME", rich_help_panel=EXECUTOR,
            help="--executor slurm: the partition trials are submitted to (default: the "
            "cluster's).",
        )],
        None,
    ),
    "account": (
        Annotated[str | None, typer.Option(
            "--account", envvar="BISECT_SLURM_ACCOUNT", show_default=False,
            metavar="NAME", rich_help_panel=EXECUTOR,
            help="--executor slurm: the account trials are charged to.",
        )],
        None,
    ),
    "qos": (
        Annotated[str | None, typer.Option(
            "--qos", envvar="BISECT_SLURM_QOS", show_default=False,
            metavar="NAME", rich_help_panel=EXECUTOR,
            help="--executor slurm: the quality of service trials ask for.",
        )],
        None,
    ),
    "build_minutes": (
        Annotated[int, typer.Option(
            "--build-minutes", envvar="BISECT_SLURM_BUILD_MINUTES", min=0,
            metavar="MIN", rich_help_panel=EXECUTOR,
            help="--executor slurm: minutes each job may spend building its environment, "
            "added to the trial's timeout for the job's --time.",
        )],
        DEFAULT_BUILD_MINUTES,
    ),
}  # fmt: skip


def with_executor_options(func: F) -> F:
    """Add the executor options (`_PARAMS`) to a command."""
    signature = inspect.signature(func)
    params = list(signature.parameters.values())
    var_kw = [p for p in params if p.kind is inspect.Parameter.VAR_KEYWORD]
    plain = [p for p in params if p.kind is not inspect.Parameter.VAR_KEYWORD]
    added = [
        inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=ann)
        for name, (ann, default) in _PARAMS.items()
    ]

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        choice = ExecutorChoice(
            kind=ExecutorKind(kwargs.pop("executor")),
            image=kwargs.pop("image"),
            cache_volume=kwargs.pop("cache_volume"),
            env_volume=kwargs.pop("env_volume") or None,
            cgroup_root=Path(kwargs.pop("cgroup_root")),
            slurm_dir=kwargs.pop("slurm_dir"),
            partition=kwargs.pop("partition"),
            account=kwargs.pop("account"),
            qos=kwargs.pop("qos"),
            build_minutes=kwargs.pop("build_minutes"),
        )
        token = _CHOICE.set(choice)
        try:
            return func(*args, **kwargs)
        finally:
            _CHOICE.reset(token)

    new = [*(p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in plain), *added, *var_kw]
    wrapper.__signature__ = signature.replace(parameters=new)  # type: ignore[attr-defined]
    wrapper.__annotations__ = {p.name: p.annotation for p in new if p.kind != p.VAR_KEYWORD}
    return wrapper  # type: ignore[return-value]


def chosen() -> ExecutorChoice:
    """The executor options of the running command."""
    return _CHOICE.get() or ExecutorChoice()


def make_executor(settings: Settings, gpu: GpuProbe | None, runner_name: str) -> Executor:
    """The chosen executor, or one line on stderr and the exit status of `Unavailable`."""
    choice = chosen()
    try:
        if choice.kind is ExecutorKind.docker:
            from runners.docker.executor import DockerExecutor

            return DockerExecutor.from_env(
                runner_name=runner_name,
                image=choice.image,
                cache_volume=choice.cache_volume,
                env_volume=choice.env_volume,
                gpu=gpu,
                cgroup_root=choice.cgroup_root,
            )
        if choice.kind is ExecutorKind.slurm:
            return _slurm_executor(choice, runner_name)
        return LocalExecutor(settings.env_root, settings.uv_cache_dir, gpu)
    except (Unavailable, InvalidInput) as exc:
        fail(str(exc), exit_status(exc))


def _slurm_executor(choice: ExecutorChoice, runner_name: str) -> Executor:
    from runners.agent import stderr_log
    from runners.slurm.executor import SlurmExecutor

    if choice.slurm_dir is None:
        raise InvalidInput(
            "--executor slurm needs --slurm-dir: a directory every compute node sees at "
            "the same path",
            field="slurm_dir",
        )
    options = SlurmOptions(
        shared_dir=choice.slurm_dir.absolute(),
        python=sys.executable,
        partition=choice.partition,
        account=choice.account,
        qos=choice.qos,
        build_minutes=choice.build_minutes,
    )
    return SlurmExecutor(runner_name, options, log=stderr_log)
