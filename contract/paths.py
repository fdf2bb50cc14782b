"""Where a runner keeps its environments and the uv cache unless told otherwise: the runner
uses these defaults, and the service's settings (what `bisect-cli run` and `serve` hand their
executors) start from the same ones.
"""

import os
from pathlib import Path


def cache_home() -> Path:
    """Where environments and the uv cache live unless configured (``BISECT_CACHE_DIR``).

    ``$XDG_CACHE_HOME/leakbisect`` when set; else, for root, ``/var/cache/leakbisect``:
    root's own ``~/.cache`` is under /root (mode 0700 on most systems), which the trial
    and build users cannot enter, so their environments could not run; else
    ``~/.cache/leakbisect``.
    """
    xdg = os.environ.get("XDG_CACHE_HOME")
    if xdg:
        return Path(xdg) / "leakbisect"
    if os.geteuid() == 0:
        return Path("/var/cache/leakbisect")
    return Path.home() / ".cache" / "leakbisect"


def uv_cache_dir(home: Path | None = None) -> Path:
    """The uv cache the builds share: ``$UV_CACHE_DIR`` when set (sharing the user's own
    makes cold builds warm), else ``<cache home>/uv``. The one definition of it."""
    if os.environ.get("UV_CACHE_DIR"):
        return Path(os.environ["UV_CACHE_DIR"])
    return (home if home is not None else cache_home()) / "uv"
