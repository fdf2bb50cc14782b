"""`python -m service.example`: the worked examples' inputs, and an index on a given port."""

import platform
import socket
import urllib.request
from pathlib import Path

import pytest

from service.example.__main__ import main
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
