"""Text from outside (script output, uv's messages, names a job gives) made safe to show.

A repro script's output reaches terminals through `bisect-cli logs` and the reports; left
as it is, an escape sequence in it could move the cursor, rewrite earlier lines, set the
window title or, in some terminals, worse. `printable` drops ANSI escape sequences (CSI,
OSC, and the other ESC forms) and every C0/C1 control character except newline and tab,
and turns carriage returns into newlines (a progress bar stays readable). Rich markup is
a separate matter: print outside text with `markup=False` or `rich.markup.escape`.
"""

import re

_ESCAPES = re.compile(
    r"\x1b\[[0-?]*[ -/]*[@-~]"  # CSI: colours, cursor moves, erasing
    r"|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\\\)?"  # OSC: titles, hyperlinks, clipboard
    r"|\x1b[PX^_][^\x1b]*(?:\x1b\\\\)?"  # DCS, SOS, PM, APC strings
    r"|\x1b[ -~]"  # every other escape: ESC and one character (ESC 7, ESC c, ...)
    r"|\x9b[0-?]*[ -/]*[@-~]"  # 8-bit CSI
)
_CONTROLS = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]")


def printable(text: str) -> str:
    """`text` without escape sequences or control characters (newlines and tabs kept)."""
    text = _ESCAPES.sub("", text)
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    return _CONTROLS.sub("", text)
