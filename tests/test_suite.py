"""service.example.suite: the files it writes, and (real uv, real venvs) which mixes leak."""

import subprocess
import sys
from pathlib import Path

import pytest
from uv import find_uv_bin

from service.example.suite import SCENARIOS, Suite, build_suite, import_name

MODULES = ["suite_alpha", "suite_beta", "suite_gamma", "suite_delta", "suite_epsilon", "suite_zeta"]
# Runs in the suite venv: MiB still traced after 40 steps of every package (after a collect).
PROBE = """\
import gc, importlib, sys, tracemalloc
tracemalloc.start()
modules = [importlib.import_module(m) for m in sys.argv[1:]]
gc.collect()
base = tracemalloc.get_traced_memory()[0]
for _ in range(40):
    for m in modules:
        m.step()
gc.collect()
print((tracemalloc.get_traced_memory()[0] - base) // (1 << 20))
"""


@pytest.fixture(scope="module")
def suites(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Suite]:
    root = tmp_path_factory.mktemp("suites")
    return {s: build_suite(root / s, s) for s in SCENARIOS}


class Venv:
    """One venv under tmp_path; `sync` makes it hold exactly the given pins."""

    def __init__(self, path: Path, find_links: Path, cache: Path) -> None:
        self.path, self.find_links, self.cache = path, find_links, cache
        self._uv("venv", "--quiet", "--python", sys.executable, str(path))

    def _uv(self, *args: str) -> subprocess.CompletedProcess[str]:
        env = {
            "VIRTUAL_ENV": str(self.path),
            "PATH": "/usr/bin:/bin",
            "UV_CACHE_DIR": str(self.cache),
        }
        return subprocess.run(
            [find_uv_bin(), *args], env=env, capture_output=True, text=True, timeout=120
        )

    def sync(self, pins: list[str]) -> subprocess.CompletedProcess[str]:
        req = self.path / "pins.txt"
        req.write_text("".join(p + "\n" for p in pins))
        return self._uv("pip", "sync", "--no-index", "--find-links", str(self.find_links), str(req))

    def install(self, pins: list[str]) -> subprocess.CompletedProcess[str]:
        return self._uv("pip", "install", "--no-index", "--find-links", str(self.find_links), *pins)

    def grown_mib(self, pins: list[str]) -> int:
        done = self.sync(pins)
        assert done.returncode == 0, done.stderr
        python = self.path / "bin" / "python"
        out = subprocess.run(
            [python, "-c", PROBE, *MODULES], capture_output=True, text=True, timeout=120
        )
        assert out.returncode == 0, out.stderr
        return int(out.stdout)


def pins(path: Path, **changes: str) -> list[str]:
    """The pins of good.txt/bad.txt with some packages moved (`suite_gamma="1.0.2"`)."""
    lines = path.read_text().splitlines()
    moved = {k.replace("_", "-"): v for k, v in changes.items()}
    return [f"{n}=={moved.get(n, v)}" for n, _, v in (line.partition("==") for line in lines)]


@pytest.fixture
def venv_for(tmp_path: Path, uv_cache: Path, suites: dict[str, Suite]):
    return lambda scenario: Venv(tmp_path / "venv", suites[scenario].find_links, uv_cache)


def test_one_files(suites):
    suite = suites["one"]
    assert suite.good.read_text() == (
        "suite-alpha==0.4.0\nsuite-beta==2.0.0\nsuite-delta==1.0.0\n"
        "suite-epsilon==1.0.0\nsuite-gamma==1.0.0\nsuite-zeta==3.1.0\n"
    )
    assert suite.bad.read_text() == (
        "suite-alpha==0.4.3\nsuite-beta==2.0.4\nsuite-delta==1.1.1\n"
        "suite-epsilon==1.0.3\nsuite-gamma==1.0.5\nsuite-zeta==3.1.2\n"
    )
    wheels = sorted(p.name for p in suite.find_links.glob("*.whl"))
    assert len(wheels) == 4 + 5 + 6 + 5 + 4 + 3
    assert [w for w in wheels if w.startswith("suite_gamma-")] == [
        f"suite_gamma-1.0.{i}-py3-none-any.whl" for i in range(6)
    ]
    assert (suite.culprits, dict(suite.first_bad)) == (("suite-gamma",), {"suite-gamma": "1.0.3"})


def test_answers_and_pins_per_scenario(suites):
    assert dict(suites["interaction"].first_bad) == {"suite-beta": "2.0.2", "suite-delta": "1.1.0"}
    assert suites["interaction"].culprits == ("suite-beta", "suite-delta")
    unresolvable = suites["unresolvable"]
    assert dict(unresolvable.first_bad) == {"suite-gamma": "1.0.3"}
    assert "suite-epsilon==1.4.0\n" in unresolvable.good.read_text()
    assert "suite-zeta==1.3.0\n" in unresolvable.good.read_text()
    assert "suite-epsilon==2.1.0\n" in unresolvable.bad.read_text()
    assert "suite-zeta==2.0.1\n" in unresolvable.bad.read_text()
    with pytest.raises(
        ValueError, match="unknown scenario 'two': one of one, interaction, unresolvable"
    ):
        build_suite(unresolvable.find_links.parent / "two", "two")


def test_repro_prints_one_marker_per_step(suites, venv_for):
    venv = venv_for("one")
    assert venv.sync(pins(suites["one"].bad)).returncode == 0
    out = subprocess.run(
        [venv.path / "bin" / "python", suites["one"].repro],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert (out.returncode, out.stdout) == (0, "::leakbisect-step::\n" * 40)
    assert [f"import {m}" for m in MODULES] == [
        line
        for line in suites["one"].repro.read_text().splitlines()
        if line.startswith("import suite")
    ]
    assert import_name("suite-gamma") == "suite_gamma"


def test_one_only_gamma_leaks(suites, venv_for):
    suite, venv = suites["one"], venv_for("one")
    assert venv.grown_mib(pins(suite.good)) == 0
    assert venv.grown_mib(pins(suite.bad)) == 40
    # Everything else new, gamma at its last clean release: clean; gamma alone new: leaks.
    assert venv.grown_mib(pins(suite.bad, suite_gamma="1.0.2")) == 0
    assert venv.grown_mib(pins(suite.good, suite_gamma="1.0.3")) == 40


def test_interaction_needs_both(suites, venv_for):
    suite, venv = suites["interaction"], venv_for("interaction")
    assert venv.grown_mib(pins(suite.good)) == 0
    assert venv.grown_mib(pins(suite.bad)) == 40
    assert venv.grown_mib(pins(suite.good, suite_beta="2.0.4")) == 0
    assert venv.grown_mib(pins(suite.good, suite_delta="1.1.1")) == 0
    assert venv.grown_mib(pins(suite.good, suite_beta="2.0.2", suite_delta="1.1.0")) == 40
    assert venv.grown_mib(pins(suite.bad, suite_beta="2.0.1")) == 0
    assert venv.grown_mib(pins(suite.bad, suite_delta="1.0.2")) == 0


def test_unresolvable_mix_has_no_solution(suites, venv_for):
    suite, venv = suites["unresolvable"], venv_for("unresolvable")
    assert venv.grown_mib(pins(suite.good)) == 0
    assert venv.grown_mib(pins(suite.bad)) == 40
    assert venv.grown_mib(pins(suite.bad, suite_gamma="1.0.2")) == 0
    mix = venv.install(pins(suite.good, suite_epsilon="2.0.0"))
    assert mix.returncode == 1
    assert "No solution found" in mix.stderr
    assert "suite-epsilon==2.0.0 depends on suite-zeta>=2" in mix.stderr
    # `uv pip sync` installs exactly what it is given, unchecked: the mix "works" there, and
    # only `uv pip check` says it is invalid. A strict mix has to go through `uv pip install`.
    assert venv.sync(pins(suite.good, suite_epsilon="2.0.0")).returncode == 0
    check = venv._uv("pip", "check")
    assert check.returncode == 1
    assert (
        "The package `suite-epsilon` requires `suite-zeta>=2`, but `1.3.0` is installed"
        in check.stderr
    )
    # New epsilon with new zeta resolves, and stays clean while gamma is old.
    assert venv.grown_mib(pins(suite.good, suite_epsilon="2.0.0", suite_zeta="2.0.0")) == 0
