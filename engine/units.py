"""Parsing of human sizes such as `8G` or `512MiB` (pure)."""

import math
import re

_UNITS = {
    "": 1,
    "b": 1,
    "k": 1024,
    "kb": 1000,
    "kib": 1024,
    "m": 1024**2,
    "mb": 1000**2,
    "mib": 1024**2,
    "g": 1024**3,
    "gb": 1000**3,
    "gib": 1024**3,
    "t": 1024**4,
    "tb": 1000**4,
    "tib": 1024**4,
}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$")
SIZE_HELP = "a positive size such as 4G, 512MiB, 1.5GB or a byte count"


def parse_size(text: str | int) -> int:
    """Bytes in `text`; single letters are binary (4G = 4 GiB), as in docker and ulimit."""
    if isinstance(text, int):
        if text <= 0:
            raise ValueError(f"{text!r} is not {SIZE_HELP}")
        return text
    match = _SIZE.match(text)
    unit = match.group(2).lower() if match else ""
    if not match or unit not in _UNITS:
        raise ValueError(f"{text!r} is not {SIZE_HELP}")
    number = float(match.group(1)) * _UNITS[unit]
    if not math.isfinite(number):  # 400 digits: int() of the float's inf would overflow
        shown = repr(text) if len(text) <= 40 else f"{text[:20]!r}... ({len(text)} characters)"
        raise ValueError(f"{shown} is too large for a size")
    value = int(number)
    if value <= 0:
        raise ValueError(f"{text!r} is not {SIZE_HELP}")
    return value

