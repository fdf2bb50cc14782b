"""`python -m service.example`: the worked examples' inputs, and an index on a given port."""

import platform
import re
import signal
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from service.example.__main__ import main
from service.example.gitrepo import build_repo
from service.example.index import serve_index


def test_suite_gitrepo_and_fixture_write_what_they_say(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["suite", str(tmp_path / "s"), "interaction"]) == 0
    s = tmp_path / "s"
    assert capsys.readouterr().out == (
        f"{s / 'good.txt'} {s / 'bad.txt'} {s / 'repro.py'}; culprits: suite-beta, suite-delta\n"
    )
    assert main(["gitrepo", str(tmp_path / "r")]) == 0
    assert capsys.readouterr().out.startswith(f"{tmp_path / 'r'}: 12 commits v1.0.5..v1.0.6, ")
    assert main(["fixture", str(tmp_path / "w"), "--native"]) == 0
    assert (tmp_path / "w" / "index.json").is_file()
    assert sorted(p.name for p in (tmp_path / "w").glob("*1.0.6-*.whl")) == [
        f"leakyfixture-1.0.6-py3-none-linux_{platform.machine()}.whl"
    ]


def test_an_index_served_on_the_port_asked_for(tmp_path: Path) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with serve_index(tmp_path, port=port) as url:
        assert url == f"http://127.0.0.1:{port}/simple"
        with urllib.request.urlopen(url + "/", timeout=10) as page:
            assert page.status == 200


def _sigint(disposition: str) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN if disposition == "ignored" else signal.SIG_DFL)


@pytest.mark.parametrize("inherited", ["default", "ignored"])
def test_serve_git_serves_the_repository_until_interrupted(tmp_path: Path, inherited: str) -> None:
    """`serve-git REPO`: prints the URL, git clones it over http, Ctrl-C ends it cleanly, also
    when started with SIGINT ignored (a background job of a non-interactive shell: CI)."""
    made = build_repo(tmp_path / "repo")
    stacks = tmp_path / "stacks.txt"  # faulthandler's dump, should it hang at the end
    with stacks.open("w") as err:
        proc = subprocess.Popen(
            [sys.executable, "-X", "faulthandler", "-m", "service.example", "serve-git",
             str(made.path)], stdout=subprocess.PIPE, stderr=err, text=True,
            preexec_fn=lambda: _sigint(inherited),
        )  # fmt: skip
    try:
        assert proc.stdout is not None
        url = proc.stdout.readline().strip()
        assert re.fullmatch(r"http://127\.0\.0\.1:\d+/leakyfixture\.git", url), url
        listed = subprocess.run(["git", "ls-remote", "--tags", url], capture_output=True,
                                text=True, timeout=30, check=True)  # fmt: skip
        tags = {line.split("\t")[1] for line in listed.stdout.splitlines()}
        assert tags == {"refs/tags/v1.0.5", "refs/tags/v1.0.6"}
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            code = proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGABRT)  # faulthandler prints every thread's stack
            proc.wait(timeout=10)
            pytest.fail(f"serve-git did not end on SIGINT; its threads:\n{stacks.read_text()}")
        assert code == 0, stacks.read_text()
