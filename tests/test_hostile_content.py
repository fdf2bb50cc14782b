"""Hostile environment files (issue 26, row 2 and row 7's lock files): the event loop never
waits on a request's content, and no content answers 500.

A 1 MiB `base_env` of `\\`-continued lines froze every route for ~9.6 s (a quadratic
join, run by a validator on the event loop); a `uv.lock` with `package = 5`, a pylock with
`packages = 5` and 3000-deep TOML answered 500. Each case here names the line and the
limit (engine/baseenv.py), and the submission is validated in a worker thread
(service/api/routes/jobs.py), so other requests are answered meanwhile.
"""

import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from contract.errors import InvalidInput
from engine import baseenv
from service.app import create_app
from tests.test_api_hostile import ALICE, API, _serve, auth, settings, tokens

pytestmark = pytest.mark.timeout(300)

# A closed loopback port: nothing here may reach an index, and a body the old code
# accepted fails there rather than anywhere else.
INDEX = "http://127.0.0.1:9/simple"
CONTINUED = "`\\` continuations"


def job(base_env: str, name: str | None = None) -> dict[str, Any]:
    body = {"package": "leakyfixture", "range": "1.0.0..1.0.9", "script": "pass"}
    return {**body, "index_url": INDEX, "base_env": base_env, "base_env_name": name}


def refused(text: str, name: str | None = None) -> str:
    with pytest.raises(InvalidInput) as caught:
        baseenv.parse(text, name)
    return caught.value.detail()


@pytest.fixture
def client(tmp_path: Path) -> Iterator[TestClient]:
    with TestClient(create_app(settings(tmp_path, **tokens()))) as client:
        yield client


# ------------------------------------------------------- continued lines, in one pass

# The review's attack: 1 MiB of continued lines, short (more lines than a file has) or
# long enough to stay under the line count (one line longer than a line may be).
SHORT = "numpy==1.26.4 \\\n" + "a \\\n" * (1024 * 1024 // 4 - 4)
LONG = "numpy==1.26.4 \\\n" + ("x" * 28 + " \\\n") * (1024 * 1024 // 32 - 1)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (SHORT, "base_env: 262141 lines; at most 50000"),
        (LONG, f"base_env: line 1 is longer than 65536 characters with its {CONTINUED}"),
    ],
)
def test_a_mebibyte_of_continued_lines_is_refused_naming_the_limit(
    client: TestClient, text: str, message: str
) -> None:
    assert len(text.encode()) <= baseenv.MAX_BYTES
    answer = client.post(f"{API}/jobs", json=job(text), headers=auth(ALICE))
    assert (answer.status_code, answer.json()) == (422, {"detail": message})


def test_continued_lines_within_the_limits_are_joined_once() -> None:
    """A pip-compile file with every wheel's hash: 1 MiB of continuations, each pin whole."""
    block = "pkg{}==1.{} \\\n" + "    --hash=sha256:0123456789abcdef \\\n" * 1500 + "    # x\n"
    text = "".join(block.format(i, i) for i in range(1024 * 1024 // len(block)))
    assert len(text.encode()) > 900 * 1024
    parsed = baseenv.parse(text)
    assert parsed.format == baseenv.FREEZE
    assert parsed.pins == {f"pkg{i}": f"1.{i}" for i in range(len(parsed.pins))}
    assert len(parsed.pins) == 1024 * 1024 // len(block)


def test_other_requests_are_answered_while_a_submission_is_validated(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The environment files are parsed in a worker thread: with the parser held, the job
    list and a runner's registration are answered before the submission is."""
    entered, release = threading.Event(), threading.Event()
    parse = baseenv.parse

    def held(*args: Any, **kwargs: Any) -> baseenv.BaseEnv:
        entered.set()
        release.wait(60)
        return parse(*args, **kwargs)

    monkeypatch.setattr(baseenv, "parse", held)
    server, thread, port = _serve(settings(tmp_path, **tokens(), trusted_hosts=["127.0.0.1"]))
    answers: dict[str, httpx.Response] = {}
    with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60) as http:

        def submit() -> None:
            answers["submit"] = http.post(f"{API}/jobs", json=job(LONG), headers=auth(ALICE))

        submitting = threading.Thread(target=submit)
        submitting.start()
        try:
            assert entered.wait(60), "the submission never reached the parser"
            listed = http.get(f"{API}/jobs", headers=auth(ALICE), timeout=10)
            registered = http.post(
                f"{API}/runners", json={"name": "r1"}, headers=auth("run-tok"), timeout=10
            )
            still_validating = "submit" not in answers
        finally:
            release.set()
            submitting.join(60)
            server.should_exit = True
            thread.join(10)
    assert still_validating
    assert listed.status_code == 200 and listed.json()["total"] == 0
    assert registered.status_code == 201, registered.text
    assert answers["submit"].status_code == 422
    assert answers["submit"].json() == {
        "detail": f"base_env: line 1 is longer than 65536 characters with its {CONTINUED}"
    }


# ------------------------------------------------------------ hostile lock files

DEEP = "[" * 3000 + "]" * 3000
ENTRY = '[[package]]\nname = "numpy"\nversion = "1.26.4"\nsource = { registry = "x" }\n'

HOSTILE_LOCKS: list[tuple[str, str, str]] = [
    (
        "version = 1\npackage = 5\n",
        "uv.lock",
        "uv.lock line 2: package must be an array of tables, not an integer",
    ),
    (
        'lock-version = "1.0"\npackages = 5\n',
        "pylock.toml",
        "pylock.toml line 2: packages must be an array of tables, not an integer",
    ),
    (
        'lock-version = "1.0"\npackages = "numpy==1.26.4"\n',
        "pylock.toml",
        "pylock.toml line 2: packages must be an array of tables, not a string",
    ),
    (
        "version = 1\n[package]\nname = 'numpy'\n",
        "uv.lock",
        "uv.lock line 2: package must be an array of tables, not a table",
    ),
    (
        "package = [5]\n",
        "uv.lock",
        "uv.lock line 1: package entry 1 must be a table, not an integer",
    ),
    (
        ENTRY + ENTRY.replace('"1.26.4"', "1.26"),
        "uv.lock",
        "uv.lock line 7: package entry 2: version must be a string, not a float",
    ),
    (
        ENTRY.replace('{ registry = "x" }', "5"),
        "uv.lock",
        "uv.lock line 4: package entry 1: source must be a table, not an integer",
    ),
    (
        ENTRY.replace('"x"', "[1]"),
        "uv.lock",
        "uv.lock line 4: package entry 1: source.registry must be a string, not an array",
    ),
    (
        ENTRY.replace('name = "numpy"\n', ""),
        "uv.lock",
        "uv.lock line 1: package entry 1 has no name",
    ),
    (
        '[[packages]]\nname = 5\nversion = "1.0"\n',
        "pylock.toml",
        "pylock.toml line 2: packages entry 1: name must be a string, not an integer",
    ),
    (
        '[[packages]]\nname = "numpy"\nversion = 1979-05-27\n',
        "pylock.toml",
        "pylock.toml line 3: packages entry 1: version must be a string, not a date",
    ),
    (
        f"version = 1\n\nx = {DEEP}\n" + ENTRY,
        "uv.lock",
        "uv.lock line 3: nested more than 32 levels deep (arrays, inline tables or dotted keys)",
    ),
    (
        "x = " + "{a = " * 3000 + "1" + "}" * 3000 + "\n" + ENTRY,
        None,  # detected from its [[package]] table
        "uv.lock line 1: nested more than 32 levels deep (arrays, inline tables or dotted keys)",
    ),
    (
        ENTRY + "[" + "a." * 3000 + "a]\n",
        "uv.lock",
        "uv.lock line 5: nested more than 32 levels deep (arrays, inline tables or dotted keys)",
    ),
    (
        f'lock-version = "1.0"\n[[packages]]\nname = "numpy"\nversion = "1.0"\nx = {DEEP}\n',
        "pylock.toml",
        "pylock.toml line 5: nested more than 32 levels deep (arrays, inline tables or "
        "dotted keys)",
    ),
]


@pytest.mark.parametrize(("text", "name", "message"), HOSTILE_LOCKS)
def test_a_hostile_lock_is_422_naming_the_field_and_line(
    client: TestClient, text: str, name: str | None, message: str
) -> None:
    answer = client.post(f"{API}/jobs", json=job(text, name), headers=auth(ALICE))
    assert (answer.status_code, answer.json()) == (422, {"detail": f"base_env: {message}"})


def test_the_nesting_scan_skips_strings_and_comments() -> None:
    """Brackets and dots in strings and comments nest nothing; the lock parses."""
    ml_literal, ml_basic = "'" * 3, '"' * 3
    strings = [
        'b{} = "[[[{{{{{{ a.b.c \\" [[["',
        "l{} = '[[[[' # [[[[[[ a.b.c.d",
        "m{} = " + ml_literal + "\n[[[[\n" + ml_literal,
        "n{} = " + ml_basic + "[" * 100 + '\\"' + ml_basic + '"',
        "f{} = [1.5, 2.5, 1979-05-27T07:32:00.999]",
    ]
    noise = "".join(f"{line.format(i)}\n" for i in range(40) for line in strings)
    assert baseenv.parse(noise + ENTRY, "uv.lock").pins == {"numpy": "1.26.4"}
    dotted = "[" + ".".join("a" * 32) + "]\n" + ENTRY  # 32 levels: the most there may be
    assert baseenv.parse(dotted, "uv.lock").pins == {"numpy": "1.26.4"}
    assert refused("[" + ".".join("a" * 33) + "]\n" + ENTRY, "uv.lock") == (
        "base_env: uv.lock line 1: nested more than 32 levels deep (arrays, inline tables or "
        "dotted keys)"
    )


def test_deep_toml_in_from_and_to_names_their_field(client: TestClient) -> None:
    body = {
        "script": "pass",
        "index_url": INDEX,
        "from_env": f"x = {DEEP}\n{ENTRY}",
        "from_env_name": "uv.lock",
        "to_env": ENTRY,
        "to_env_name": "uv.lock",
    }
    answer = client.post(f"{API}/jobs", json=body, headers=auth(ALICE))
    assert answer.status_code == 422
    # Then the rules a refused --from leaves unmet: --to alone, no package, no range.
    assert answer.json()["detail"].split("; ")[0] == (
        "from_env: uv.lock line 1: nested more than 32 levels deep (arrays, inline "
        "tables or dotted keys)"
    )


# ------------------------------------------------------------------------- limits


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("numpy==1.26.4\n" + "\n" * 60_000, "60001 lines; at most 50000"),
        ("numpy==1.26.4\n# " + "x" * 70_000 + "\n", "line 2 is longer than 65536 characters"),
        (
            "numpy==1.26.4 \\\n" + "  --hash=sha256:00 \\\n" * 4000 + "\n",
            f"line 1 is longer than 65536 characters with its {CONTINUED}",
        ),
        (
            "a[" + "b," * 600 + "b]==1.0\n",
            f"line 1: 'a[{'b,' * 37}b...' is longer than 1000 characters without its hashes; "
            "a pin is name==version",
        ),
        (
            "numpy==1.26.4\nscipy==1.0\0\n",
            "line 2: a NUL character; an environment file is UTF-8 text",
        ),
        (
            "numpy==1.26.4\n\n\ud800==1.0\n",
            "line 3: a lone surrogate; an environment file is UTF-8 text",
        ),
        (
            "".join(f"pkg{i}==1.0\n" for i in range(5001)),
            "at most 5000 packages, got 5001",
        ),
    ],
)
def test_each_limit_is_named_when_passed(text: str, message: str) -> None:
    assert refused(text) == f"base_env: {message}"


def test_a_lone_surrogate_over_the_api_is_422(client: TestClient) -> None:
    """JSON can carry `\\ud800`, which no file holds and no database column takes."""
    body = json.dumps(job("numpy==1.26.4\n\ud800==1\n"))  # ASCII: the surrogate escaped
    headers = {**auth(ALICE), "Content-Type": "application/json"}
    answer = client.post(f"{API}/jobs", content=body, headers=headers)
    assert answer.status_code == 422
    assert answer.json() == {
        "detail": "base_env: line 2: a lone surrogate; an environment file is UTF-8 text"
    }


def test_a_pin_with_many_extras_is_read_without_packaging_s_parser() -> None:
    """Extras are dropped (they name no version); a file of long ones still parses."""
    extras = ",".join(f"e{j}" for j in range(200))
    text = "".join(f"p{i}[{extras}] == 1.{i}\n" for i in range(900))
    assert len(text.encode()) > 800_000
    assert baseenv.parse(text).pins == {f"p{i}": f"1.{i}" for i in range(900)}
