"""Webhooks (issue 28 item 4): a job that ends posts one signed JSON payload, retried with
backoff, logged on the job's page and in the API; refused URLs never get a connection.

A real receiver (an HTTP server on 127.0.0.1, listed in the test's BISECT_WEBHOOK_HOSTS)
records what it is sent and answers what each test scripts; `verify` is a receiver's check
written from the README's scheme, not the service's own code, so it can fail. Jobs are
driven over the real API by test_api.py's fake runner loop (a stand-in for a runner: no uv
runs), on SQLite and on Postgres.
"""

import hashlib
import hmac
import json
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlmodel import Session, select
from typer.testing import CliRunner

from service.cli import app as cli_app
from service.db import get_engine
from service.models import Job, WebhookDelivery
from service.scheduler import cancel
from service.settings import Settings
from service.webhooks import deliver_due, deliver_job
from tests import test_api
from tests.test_api import API, body, drive, register, submit

db_url = test_api.db_url  # SQLite and Postgres, as the API's own tests
make_client = test_api.make_client

SECRET = "receiver-and-service-share-this-32+chars"
# Short waits between attempts: the schedule is a setting, so no test waits minutes.
FAST = {
    "webhook_secret": SECRET,
    "webhook_hosts": ["127.0.0.1"],
    "webhook_backoff_s": [0.1, 0.1, 0.1, 0.1],
    "webhook_interval_s": 0.05,
    "webhook_timeout_s": 5.0,
}


# ---------------------------------------------------------------------------- receiver


def verify(secret: str, header: str, body: bytes, now: float, tolerance_s: float = 300) -> bool:
    """A receiver's check, as the README gives it: HMAC-SHA256 of "<t>." + body, and t
    within `tolerance_s` of the receiver's clock."""
    try:
        fields = dict(part.split("=", 1) for part in header.split(","))
        timestamp = int(fields["t"])
    except (KeyError, ValueError):
        return False
    if abs(now - timestamp) > tolerance_s:
        return False
    signed = f"{timestamp}.".encode() + body
    expected = hmac.new(secret.encode(), signed, hashlib.sha256).hexdigest()
    return hmac.compare_digest(expected, fields.get("v1", ""))


class Receiver:
    """An HTTP server on 127.0.0.1 that records every POST and answers from a script."""

    def __init__(self, answers: list[tuple[int, str]], delay_s: float = 0) -> None:
        self.answers = list(answers)
        self.delay_s = delay_s  # before answering: a receiver that hangs
        self.got: list[tuple[dict[str, str], bytes, float]] = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                data = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                receiver.got.append((dict(self.headers), data, time.time()))
                time.sleep(receiver.delay_s)
                status, text = receiver.answers.pop(0) if receiver.answers else (200, "ok")
                self.send_response(status)
                self.send_header("Content-Length", str(len(text.encode())))
                self.end_headers()
                self.wfile.write(text.encode())

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"

    def __enter__(self) -> "Receiver":
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver_factory() -> Iterator[Callable[..., Receiver]]:
    made: list[Receiver] = []

    def make(*answers: tuple[int, str], delay_s: float = 0) -> Receiver:
        made.append(Receiver(list(answers), delay_s).__enter__())
        return made[-1]

    yield make
    for receiver in made:
        receiver.__exit__()


def until(done: Callable[[], bool], timeout_s: float = 60) -> None:
    """Wait for `done` (a condition, not a timing: the timeout only ends a hung test)."""
    deadline = time.monotonic() + timeout_s
    while not done():
        assert time.monotonic() < deadline, "the condition never held"
        time.sleep(0.05)


def hooks(client: TestClient, job_id: int) -> list[dict[str, Any]]:
    response = client.get(f"{API}/jobs/{job_id}/webhooks")
    assert response.status_code == 200, response.text
    return response.json()


def settled(client: TestClient, job_id: int) -> Callable[[], bool]:
    return lambda: all(h["status"] != "pending" for h in hooks(client, job_id) or [{}])


def submit_and_cancel(client: TestClient, index: str, url: str) -> int:
    job_id = submit(client, index, webhook_url=url)["id"]
    response = client.post(f"{API}/jobs/{job_id}/cancel", json={})
    assert response.status_code == 200, response.text
    return job_id


# ---------------------------------------------------------------------------- delivery


def test_a_job_that_ends_posts_one_signed_payload(
    make_client: Callable[..., Any], fixture_index: str, receiver_factory: Callable[..., Receiver]
) -> None:
    receiver = receiver_factory((200, "thanks"))
    with make_client(**FAST) as client:
        runner = register(client, "solo")
        job_id = submit(client, fixture_index, webhook_url=receiver.url)["id"]
        assert hooks(client, job_id) == []  # nothing while the job runs
        drive(client, [runner])
        until(settled(client, job_id))
        shown = client.get(f"{API}/jobs/{job_id}").json()
        [hook] = hooks(client, job_id)
        settings: Settings = client.app.state.settings  # type: ignore[attr-defined]
        with Session(get_engine(settings.effective_database_url)) as session:
            stored = session.get(Job, job_id)
            assert stored is not None and stored.finished_at is not None
            finished_at = stored.finished_at.isoformat()

    assert len(receiver.got) == 1
    headers, sent, received_at = receiver.got[0]
    payload = json.loads(sent)
    assert payload == {
        "event": "job.finished",
        "delivery": hook["id"],
        "job_id": job_id,
        "status": "found",
        "message": shown["message"],
        "package": "leakyfixture",
        "range": "1.0.0..1.0.9",
        "find_fix": False,
        "last_good": "1.0.5",
        "first_bad": "1.0.6",
        "url": f"http://testserver{API}/jobs/{job_id}",
        "page_url": f"http://testserver/jobs/{job_id}",
        "finished_at": finished_at,
    }
    assert headers["Content-Type"] == "application/json"
    assert headers["X-Leakbisect-Event"] == "job.finished"
    assert headers["X-Leakbisect-Delivery"] == str(hook["id"])
    signature = headers["X-Leakbisect-Signature"]
    assert re.fullmatch(r"t=\d+,v1=[0-9a-f]{64}", signature)
    assert verify(SECRET, signature, sent, now=received_at)
    # The verifier can fail: another secret, a changed body, a replay an hour later.
    assert not verify(SECRET.upper(), signature, sent, now=received_at)
    assert not verify(SECRET, signature, sent.replace(b"found", b"error"), now=received_at)
    assert not verify(SECRET, signature, sent, now=received_at + 3600)

    assert hook["url"] == receiver.url and hook["status"] == "delivered"
    assert hook["next_at"] is None
    [attempt] = hook["attempts"]
    assert (attempt["result"], attempt["status"], attempt["excerpt"]) == ("HTTP 200", 200, "thanks")
    assert attempt["next_at"] is None


def test_500_twice_then_200_is_three_attempts_logged_on_the_page(
    make_client: Callable[..., Any], fixture_index: str, receiver_factory: Callable[..., Receiver]
) -> None:
    receiver = receiver_factory((500, "boom\x1b[31m once"), (500, "boom twice"), (200, ""))
    with make_client(**FAST) as client:
        job_id = submit_and_cancel(client, fixture_index, receiver.url)
        until(settled(client, job_id))
        [hook] = hooks(client, job_id)
        page = client.get(f"/jobs/{job_id}")

    assert len(receiver.got) == 3
    bodies = {sent for _, sent, _ in receiver.got}
    assert len(bodies) == 1  # every attempt sends the same payload (its `delivery` dedupes)
    assert json.loads(bodies.pop())["status"] == "cancelled"
    assert all(verify(SECRET, h["X-Leakbisect-Signature"], s, now=t) for h, s, t in receiver.got)
    assert hook["status"] == "delivered"
    results = [(a["result"], a["excerpt"]) for a in hook["attempts"]]
    # The answer's excerpt is printable: the escape sequence is gone.
    assert results == [("HTTP 500", "boom once"), ("HTTP 500", "boom twice"), ("HTTP 200", None)]
    nexts = [a["next_at"] is not None for a in hook["attempts"]]
    assert nexts == [True, True, False]

    assert page.status_code == 200
    table = page.text.split('class="webhook-attempts"', 1)[1].split("</table>", 1)[0]
    row = r"<tr><td>(\d)</td><td>[^<]+</td><td>([^<]+)</td><td>([^<]*)</td></tr>"
    rows = re.findall(row, table)
    assert rows == [("1", "HTTP 500", "boom once"), ("2", "HTTP 500", "boom twice"),
                    ("3", "HTTP 200", "")]  # fmt: skip
    assert f"<code>{receiver.url}</code>: delivered" in page.text


def test_every_attempt_failing_ends_the_delivery_failed(
    make_client: Callable[..., Any], fixture_index: str, receiver_factory: Callable[..., Receiver]
) -> None:
    receiver = receiver_factory(*[(503, "down")] * 5)
    with make_client(**{**FAST, "webhook_backoff_s": [0.05, 0.05]}) as client:
        job_id = submit_and_cancel(client, fixture_index, receiver.url)
        until(settled(client, job_id))
        [hook] = hooks(client, job_id)
    assert len(receiver.got) == 3  # the first attempt and one per wait
    assert hook["status"] == "failed" and hook["next_at"] is None
    assert [a["result"] for a in hook["attempts"]] == ["HTTP 503"] * 3


def test_a_redirect_is_not_followed(
    make_client: Callable[..., Any], fixture_index: str, receiver_factory: Callable[..., Receiver]
) -> None:
    elsewhere = receiver_factory()
    receiver = receiver_factory(*[(307, "")] * 2)
    with make_client(**{**FAST, "webhook_backoff_s": [0.05]}) as client:
        job_id = submit_and_cancel(client, fixture_index, receiver.url)
        until(settled(client, job_id))
        [hook] = hooks(client, job_id)
    assert [a["result"] for a in hook["attempts"]] == ["HTTP 307 (redirects are not followed)"] * 2
    assert hook["status"] == "failed" and elsewhere.got == []


def test_a_receiver_that_does_not_answer_in_time_is_a_failed_attempt(
    make_client: Callable[..., Any], fixture_index: str, receiver_factory: Callable[..., Receiver]
) -> None:
    receiver = receiver_factory(delay_s=3)
    fields = {**FAST, "webhook_timeout_s": 0.5, "webhook_backoff_s": []}  # one attempt
    with make_client(**fields) as client:
        job_id = submit_and_cancel(client, fixture_index, receiver.url)
        until(settled(client, job_id))
        [hook] = hooks(client, job_id)
    assert hook["status"] == "failed" and len(receiver.got) == 1
    [attempt] = hook["attempts"]
    assert (attempt["result"], attempt["status"]) == ("ReadTimeout: timed out", None)


def test_the_operators_webhook_is_sent_and_never_shown(
    make_client: Callable[..., Any], fixture_index: str, receiver_factory: Callable[..., Receiver]
) -> None:
    operator = receiver_factory()
    operator_url = operator.url + "?token=capability"
    with make_client(**FAST, webhook_url=operator_url) as client:
        job_id = submit(client, fixture_index)["id"]  # no --webhook of its own
        client.post(f"{API}/jobs/{job_id}/cancel", json={})
        until(settled(client, job_id))
        [hook] = hooks(client, job_id)
        page = client.get(f"/jobs/{job_id}").text
    assert len(operator.got) == 1 and json.loads(operator.got[0][1])["job_id"] == job_id
    assert hook["url"] is None and hook["status"] == "delivered"
    assert "capability" not in json.dumps(hook) and "capability" not in page
    assert "the operator's webhook: delivered" in page


def test_a_delivery_survives_a_restart_and_is_checked_again_before_each_attempt(
    make_client: Callable[..., Any], fixture_index: str, receiver_factory: Callable[..., Receiver]
) -> None:
    receiver = receiver_factory()
    with make_client(**{**FAST, "webhook_interval_s": 0}) as client:  # no delivery loop
        job_id = submit_and_cancel(client, fixture_index, receiver.url)
        [hook] = hooks(client, job_id)
        assert (hook["status"], hook["attempts"]) == ("pending", [])
    # Restarted with 127.0.0.1 no longer listed: the row is still there, and refused.
    moved = {**FAST, "webhook_hosts": ["hooks.example.org"], "webhook_backoff_s": [1.0] * 4}
    with make_client(**moved) as client:
        until(lambda: len(hooks(client, job_id)[0]["attempts"]) >= 1)
        [hook] = hooks(client, job_id)
    assert hook["status"] == "pending"
    refused = "refused: host 127.0.0.1 is not in BISECT_WEBHOOK_HOSTS"
    assert {a["result"] for a in hook["attempts"]} == {refused}
    assert receiver.got == []
    # Listed again: the next attempt is made and delivered.
    with make_client(**FAST) as client:
        until(settled(client, job_id))
        [hook] = hooks(client, job_id)
    assert hook["status"] == "delivered" and len(receiver.got) == 1
    results = [a["result"] for a in hook["attempts"]]
    assert results[-1] == "HTTP 200" and set(results[:-1]) == {refused}


def test_two_delivery_loops_at_once_never_send_one_delivery_twice(
    make_client: Callable[..., Any], fixture_index: str, receiver_factory: Callable[..., Receiver]
) -> None:
    """Two delivery rounds at once over the same due rows, each on its own connection, as
    two API processes' loops would be: each row is claimed by one of them (FOR UPDATE SKIP
    LOCKED on Postgres, the single writer on SQLite), and each job is told once."""
    receiver = receiver_factory()
    with make_client(**{**FAST, "webhook_interval_s": 0}) as client:
        jobs = [submit_and_cancel(client, fixture_index, receiver.url) for _ in range(4)]
        settings: Settings = client.app.state.settings  # type: ignore[attr-defined]
    engine = get_engine(settings.effective_database_url)
    start = threading.Barrier(2)
    made: list[int] = []

    def loop() -> None:
        with Session(engine) as session:
            start.wait()
            made.append(deliver_due(session, settings, say=lambda _line: None))

    threads = [threading.Thread(target=loop) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sum(made) == 4
    sent = sorted(json.loads(b)["job_id"] for _, b, _ in receiver.got)
    assert sent == sorted(jobs)


# ---------------------------------------------------------------------------- refusals


def test_refused_webhook_urls_are_422_before_any_connection(
    make_client: Callable[..., Any], fixture_index: str, receiver_factory: Callable[..., Receiver]
) -> None:
    receiver = receiver_factory()
    port = receiver.url.split(":")[2].split("/")[0]
    cases = [
        ({**FAST, "webhook_hosts": []}, receiver.url,
         f"webhook_url: webhook {receiver.url}: host 127.0.0.1 is not a public address "
         "(list it in BISECT_WEBHOOK_HOSTS)"),
        ({**FAST, "webhook_hosts": []}, "http://10.1.2.3/hook",
         "webhook_url: webhook http://10.1.2.3/hook: host 10.1.2.3 is not a public address "
         "(list it in BISECT_WEBHOOK_HOSTS)"),
        ({**FAST, "webhook_hosts": ["hooks.example.org"]}, receiver.url,
         f"webhook_url: webhook {receiver.url}: host 127.0.0.1 is not in BISECT_WEBHOOK_HOSTS"),
        (FAST, f"http://127.0.0.1:{port}/a b",
         f"webhook_url: webhook 'http://127.0.0.1:{port}/a b': a URL holds no space, control "
         "character or backslash"),
        (FAST, "http://[::1/hook",
         "webhook_url: webhook 'http://[::1/hook': not a URL: Invalid IPv6 URL"),
        (FAST, "ftp://127.0.0.1/hook",
         "webhook_url: webhook ftp://127.0.0.1/hook: only http, https URLs are taken, not ftp://"),
        ({**FAST, "webhook_secret": None}, receiver.url,
         "webhook_url: this service sends no webhooks (its operator set no "
         "BISECT_WEBHOOK_SECRET)"),
    ]  # fmt: skip
    for fields, url, line in cases:
        with make_client(**fields) as client:
            response = client.post(f"{API}/jobs", json=body(fixture_index, webhook_url=url))
            assert (response.status_code, response.json()) == (422, {"detail": line})
            assert client.get(f"{API}/jobs").json()["total"] == 0
    assert receiver.got == []


def test_settings_refuse_an_unsigned_operator_webhook() -> None:
    with pytest.raises(ValueError, match="BISECT_WEBHOOK_URL needs BISECT_WEBHOOK_SECRET"):
        Settings(webhook_url="https://hooks.example.org/x")
    with pytest.raises(ValueError, match="at least 32 characters"):
        Settings(webhook_secret="short")
    assert "receiver-and" not in repr(Settings(webhook_secret=SECRET))


# ---------------------------------------------------------------------------- bisect-cli run


def test_run_refuses_a_webhook_without_a_secret(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from service.settings import get_settings

    monkeypatch.delenv("BISECT_WEBHOOK_SECRET", raising=False)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path))
    get_settings.cache_clear()
    script = tmp_path / "repro.py"
    script.write_text("print('hi')\n")
    result = CliRunner().invoke(
        cli_app,
        ["run", str(script), "--package", "leakyfixture", "--range", "1.0.0..1.0.9",
         "--webhook", "http://127.0.0.1:9/hook"],
    )  # fmt: skip
    get_settings.cache_clear()
    assert result.exit_code == 2, result.output
    assert result.output == (
        "error: --webhook: every webhook is signed; set BISECT_WEBHOOK_SECRET (32+ characters) "
        "to the secret the receiver checks\n"
    )


def test_a_local_jobs_webhooks_are_sent_by_its_own_process_under_no_host_list(
    make_client: Callable[..., Any], fixture_index: str, receiver_factory: Callable[..., Receiver]
) -> None:
    """`bisect-cli run`'s delivery (`deliver_job`), on a job marked local as `run` makes
    them: the server's loop leaves it alone; its own process sends it, retrying, to a host
    no list names (the user's own job), one line per attempt."""
    receiver = receiver_factory((500, "not yet"))
    settings = {**FAST, "webhook_hosts": ["hooks.example.org"]}
    with make_client(**settings) as client:
        job_id = submit(client, fixture_index)["id"]
        app_settings: Settings = client.app.state.settings  # type: ignore[attr-defined]
        engine = get_engine(app_settings.effective_database_url)
        with Session(engine) as session:
            job = session.get(Job, job_id)
            assert job is not None
            job.local, job.webhook_url = True, receiver.url
            session.add(job)
            session.commit()
            assert cancel(session, job, "interrupted")
        lines: list[str] = []
        with Session(engine) as session:
            assert deliver_due(session, app_settings) == 0  # a server's round takes none
            assert receiver.got == []
            deliver_job(session, app_settings, job_id, say=lines.append)
            row = session.exec(select(WebhookDelivery)).one()
    assert len(receiver.got) == 2 and row.status == "delivered"
    assert lines[0].startswith(f"webhook {row.id} of job {job_id} to {receiver.url}: attempt 1: ")
    assert "HTTP 500; next attempt at " in lines[0]
    assert lines[1].endswith("attempt 2: HTTP 200; no further attempt")


def test_run_posts_its_own_jobs_webhook_after_the_report(
    reachable_tmp: Path, uv_cache: Path, receiver_factory: Callable[..., Receiver]
) -> None:
    """`bisect-cli run --example --webhook URL`, a real local bisection: the report on
    stdout, then the webhook, retried after a 500, to a loopback host no list names (the
    job is its user's own), one line per attempt on stderr."""
    receiver = receiver_factory((500, "not yet"))
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("BISECT_")},
        "XDG_DATA_HOME": str(reachable_tmp / "data"),
        "XDG_CACHE_HOME": str(reachable_tmp / "cache"),
        "UV_CACHE_DIR": str(uv_cache),
        "BISECT_WEBHOOK_SECRET": SECRET,
        "BISECT_WEBHOOK_BACKOFF_S": "0.1",
    }
    args = ["run", "--example", "--json", "--no-attribute", "--webhook", receiver.url,
            "--database-url", f"sqlite:///{reachable_tmp / 'r.db'}"]  # fmt: skip
    proc = subprocess.run(
        [sys.executable, "-m", "service.cli", *args],
        capture_output=True, text=True, env=env, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout)  # the report alone on stdout
    assert report["first_bad"] == "1.0.6"
    assert len(receiver.got) == 2
    assert all(verify(SECRET, h["X-Leakbisect-Signature"], b, now=t) for h, b, t in receiver.got)
    payload = json.loads(receiver.got[1][1])
    assert (payload["job_id"], payload["status"]) == (report["job_id"], "found")
    assert (payload["last_good"], payload["first_bad"]) == ("1.0.5", "1.0.6")
    assert (payload["url"], payload["page_url"]) == (None, None)  # no server to link to
    said = [line for line in proc.stderr.splitlines() if line.startswith("webhook ")]
    assert len(said) == 2
    first = rf"webhook 1 of job {report['job_id']} to {re.escape(receiver.url)}: attempt 1: "
    assert re.fullmatch(first + r"HTTP 500; next attempt at 20\d\d-\S+", said[0]), said[0]
    assert said[1] == (
        f"webhook 1 of job {report['job_id']} to {receiver.url}: attempt 2: HTTP 200; "
        "no further attempt"
    )
