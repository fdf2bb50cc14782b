"""What untrusted code gets on a runner: its environment variables and its directories.

Repro scripts and everything their requirements build are untrusted (docs/security.md).
This module holds the rules every such process is started under; `runners.executor`
(scripts) and `runners.envs` (every uv command) both use it.

**The environment allowlist** (`allowed_env`): a child never inherits the runner's
environment. It gets exactly

* from the runner, where set: ``PATH``, ``LANG``, ``LC_ALL``, ``TZ``, the CA bundle
  variables (``SSL_CERT_FILE``, ``SSL_CERT_DIR``, ``REQUESTS_CA_BUNDLE``,
  ``CURL_CA_BUNDLE``, ``UV_NATIVE_TLS``), ``CUDA_VISIBLE_DEVICES``, ``CUDA_DEVICE_ORDER`` and
  ``NVIDIA_VISIBLE_DEVICES`` (which GPUs, in which order, the trial may use);
* for uv commands only (``uv=True``): the uv settings that say how to reach an index
  (TLS, credentials, timeouts, offline: `UV_PASSTHROUGH`); every other ``UV_*`` is
  dropped so that the spec alone decides what an environment contains;
* ``HOME`` (a private per-trial or per-build directory), ``TMPDIR`` when given,
  ``PYTHONUNBUFFERED=1`` (step markers arrive on time);
* the job's own declared variables (scripts only: they are not part of the environment
  spec's hash, so builds never see them), then what the caller adds (uv's cache and
  link mode).

Nothing named ``BISECT_*`` is ever passed: the runner's token (``BISECT_RUNNER_TOKEN``),
the database URL (``BISECT_DATABASE_URL``) and every other setting live under that
prefix. A job variable with that prefix is refused (`InvalidInput`, field
``variables``); the API validates variables otherwise, this module does not.

**Directories.** `private_dir` makes a directory only its user can enter (0700, owned by
the trial or build user) and removes it afterwards, whatever the code left in it. The
runner is root and that user can change the directory, so every file root puts in it,
chowns or removes there goes through `runners.safefs` (directory descriptors, no link
followed): the files and subdirectories it is given are made while the directory is
still root's, and only then is the directory handed over (``fchown`` on its descriptor).
The environment root and the uv cache are the runner's (`runners.publish`).

`become_subreaper` makes the runner process a child subreaper, the backstop behind the
per-trial supervisor (`runners.shim`): should a supervisor die, the trial's orphans
re-parent to the runner, whose clean-up kills and reaps them, instead of to init (and,
as root, a reaper thread kills and reaps any child of the runner running as the trial
or build user: `reap_orphans`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import signal
import tempfile
import threading
import time
from collections.abc import Collection, Iterator, Mapping
from pathlib import Path

from contract.errors import InvalidInput
from runners import safefs
from runners.shim import children
from runners.users import Identity

log = logging.getLogger(__name__)

PASSED = (
    "PATH", "LANG", "LC_ALL", "TZ",
    "SSL_CERT_FILE", "SSL_CERT_DIR", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "UV_NATIVE_TLS",
    "CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "NVIDIA_VISIBLE_DEVICES",
)  # fmt: skip
# uv settings that only say how to reach an index (TLS, credentials, timeouts).
UV_PASSTHROUGH = re.compile(
    r"UV_(NATIVE_TLS|SYSTEM_CERTS|INSECURE_HOST|HTTP_TIMEOUT|HTTP_RETRIES|REQUEST_TIMEOUT"
    r"|KEYRING_PROVIDER|OFFLINE|CONCURRENT_\w+|INDEX_\w+_(USERNAME|PASSWORD))"
)
RESERVED_PREFIX = "BISECT_"
DEFAULT_PATH = "/usr/local/bin:/usr/bin:/bin"


def check_variables(variables: Mapping[str, str]) -> dict[str, str]:
    """The job's variables, refusing any ``BISECT_*`` name (the runner's own namespace)."""
    for name in variables:
        if name.upper().startswith(RESERVED_PREFIX):
            raise InvalidInput(
                f"{name} is reserved: names starting with {RESERVED_PREFIX} are the "
                "runner's own settings and never reach a script",
                field="variables",
            )
    return dict(variables)


def allowed_env(
    *,
    home: Path,
    variables: Mapping[str, str] | None = None,
    uv: bool = False,
    tmpdir: Path | None = None,
    extra: Mapping[str, str] | None = None,
    source: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """The complete environment of an untrusted child (see the module docstring).

    ``source`` is where the passed-through values come from (default: `os.environ`).
    """
    src = os.environ if source is None else source
    env = {k: src[k] for k in PASSED if k in src}
    if uv:
        env.update({k: v for k, v in src.items() if UV_PASSTHROUGH.fullmatch(k)})
    env.setdefault("PATH", DEFAULT_PATH)
    env["HOME"] = str(home)
    if tmpdir is not None:
        env["TMPDIR"] = str(tmpdir)
    env["PYTHONUNBUFFERED"] = "1"
    env.update(check_variables(variables or {}))
    env.update(extra or {})
    return scrub(env)


def scrub(env: Mapping[str, str]) -> dict[str, str]:
    """`env` without anything named ``BISECT_*``: the last word on every child's environment."""
    return {k: v for k, v in env.items() if not k.upper().startswith(RESERVED_PREFIX)}


# --------------------------------------------------------------------------- directories


def _hand_over(fd: int, who: Identity | None) -> None:
    """Give the directory open as `fd` to `who`: on the descriptor, never a name."""
    if who is not None:
        os.fchown(fd, who.uid, who.gid)


def _make_private(parent: int, name: str, who: Identity | None) -> None:
    """``name`` in the directory `parent`: new (never one already there), 0700, `who`'s."""
    uid, gid = (who.uid, who.gid) if who is not None else (None, None)
    os.close(safefs.make_dir(parent, name, mode=0o700, uid=uid, gid=gid))


def remove_tree(path: Path, held: int | None = None) -> None:
    """Remove what untrusted code left, following no link (`runners.safefs.remove_tree`;
    `held`: the directory's descriptor from when it was made); a failure is logged, not
    raised: the trial's result matters more than its litter."""
    try:
        safefs.remove_tree(path, held=held)
    except FileNotFoundError:
        return
    except OSError as exc:
        log.warning("could not remove %s: %s", path, exc)


@contextlib.contextmanager
def private_dir(
    who: Identity | None,
    prefix: str,
    *,
    files: Mapping[str, bytes] | None = None,
    subdirs: Collection[str] = (),
) -> Iterator[Path]:
    """A fresh directory under the system temp dir, 0700 and owned by `who`; removed after.

    `subdirs` (0700, `who`'s) and `files` (0600, `who`'s) are made in it while it is still
    root's, so nobody can plant a link at their names first; only then is it handed over.
    """
    top = Path(tempfile.mkdtemp(prefix=prefix))
    fd = safefs.open_dir(top)
    try:
        uid, gid = (who.uid, who.gid) if who is not None else (None, None)
        for name in subdirs:
            _make_private(fd, name, who)
        for name, data in (files or {}).items():
            safefs.create_file(fd, name, data, uid=uid, gid=gid, mode=0o600)
        _hand_over(fd, who)
        yield top
    finally:
        try:
            remove_tree(top, held=fd)
        finally:
            os.close(fd)


def private_subdir(parent: Path, name: str, who: Identity | None) -> Path:
    """``parent/name``, new, 0700 and owned by `who` (a trial's HOME or TMPDIR)."""
    with safefs.dir_fd(parent) as fd:
        _make_private(fd, name, who)
    return parent / name


def give(path: Path, who: Identity | None, mode: int = 0o600, text: str = "") -> Path:
    """Create `path` holding `text` for `who`: a new file (`runners.safefs.create_file`:
    no link followed, owner and mode set on its descriptor); `runners.safefs.UnsafePath`
    when something is already there."""
    uid, gid = (who.uid, who.gid) if who is not None else (None, None)
    with safefs.dir_fd(path.parent) as fd:
        safefs.create_file(fd, path.name, text.encode(), uid=uid, gid=gid, mode=mode)
    return path


# --------------------------------------------------------------------------- the subreaper

_PR_SET_CHILD_SUBREAPER = 36
_REAP_EVERY_S = 1.0
_subreaper_lock = threading.Lock()
_subreaper = False
_reaped_uids: set[int] = set()


def become_subreaper(sandbox_uids: Collection[int] = ()) -> bool:
    """Make this process a child subreaper (once); False where the kernel cannot.

    Orphans re-parented here would stay zombies, because nothing in the runner waits for
    processes it did not start. ``sandbox_uids`` (the trial and build users, when the
    runner is root) solves that for the ones that matter: the runner never starts a
    process as those users itself (their processes run under a root supervisor), so a
    direct child of the runner with one of those uids is an orphan of a dead supervisor;
    a background thread kills and reaps such children every second.
    """
    global _subreaper
    with _subreaper_lock:
        new_uids = set(sandbox_uids) - _reaped_uids
        if new_uids:
            start = not _reaped_uids
            _reaped_uids.update(new_uids)
            if start:
                threading.Thread(target=_reaper, name="orphan-reaper", daemon=True).start()
        if _subreaper:
            return True
        try:
            import ctypes

            libc = ctypes.CDLL(None, use_errno=True)
            _subreaper = libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
        except (OSError, AttributeError):
            _subreaper = False
        return _subreaper


def _real_uid(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/status", "rb") as f:
            for line in f:
                if line.startswith(b"Uid:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


def reap_orphans(uids: Collection[int]) -> int:
    """Kill and reap this process's direct children that run as one of `uids`."""
    reaped = 0
    for pid in children(os.getpid()):
        if _real_uid(pid) not in uids:
            continue
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, 0)
            reaped += 1
    return reaped


def _reaper() -> None:
    while True:
        time.sleep(_REAP_EVERY_S)
        try:
            reap_orphans(set(_reaped_uids))
        except Exception:  # noqa: BLE001 - a backstop must never die
            log.exception("orphan reaper")
