"""What the tests of root's file handling share: a file's state, to show that nothing
outside was touched, and a call that must return (a planted FIFO would block it)."""

import stat
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any


def fingerprint(path: Path) -> tuple[bytes | None, int, int, int]:
    """Content (None for anything but a regular file), owner, group and mode of `path`
    itself (a link is not followed)."""
    st = path.lstat()
    data = path.read_bytes() if stat.S_ISREG(st.st_mode) else None
    return data, st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)


def finishes(call: Callable[[], Any], timeout: float = 60) -> Any:
    """`call` in a thread; fails if it has not returned within `timeout` (it blocked)."""
    out: dict[str, Any] = {}

    def run() -> None:
        try:
            out["value"] = call()
        except BaseException as exc:  # noqa: BLE001 - handed back to the test
            out["error"] = exc

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(timeout=timeout)
    assert not t.is_alive(), "the call blocked"
    if "error" in out:
        raise out["error"]
    return out["value"]
