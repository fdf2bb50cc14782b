"""execute_trial end to end: real uv environments from the offline index, real scripts.

What a trial hands the job's code (scripts and the build backends of its requirements):
the allowlisted environment with the job's variables, a private working directory, the
trial or build user; resolve trials; bounded reports.
"""

from __future__ import annotations

import io
import json
import os
import pwd
import re
import tarfile
import textwrap
from pathlib import Path

import pytest

from contract.wire import MAX_REPORT_SAMPLES, EnvResult, EnvSpec, Sample, TrialSpec
from runners.executor import Execution
from runners.publish import owner_key
from runners.trial import _report, execute_trial
from runners.users import identities

pytestmark = pytest.mark.timeout(300)

# The probe lives 0.3 s after printing so that the 10 Hz sampler sees it at least once: a
# script that exits within its first few milliseconds may end before the first sample.
PROBE = """
import json, os, stat, time
st = os.stat(".")
print(json.dumps({
    "env": dict(os.environ), "uid": os.getuid(), "cwd": os.getcwd(),
    "cwd_mode": stat.S_IMODE(st.st_mode), "cwd_uid": st.st_uid,
}), flush=True)
time.sleep(0.3)
"""


def spec(index: str, **kw) -> TrialSpec:
    kw.setdefault("script", PROBE)
    return TrialSpec(
        trial_id=7,
        env=EnvSpec(package="leakyfixture", version="1.0.2", index_url=index),
        timeout_s=120,
        memory_limit_bytes=512 * 2**20,
        **kw,
    )


@pytest.fixture
def env_root(reachable_tmp: Path) -> Path:
    return reachable_tmp / "envs"


def test_the_script_gets_the_allowlist_its_variables_and_a_private_home(
    fixture_index: str, env_root: Path, uv_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("BISECT_RUNNER_TOKEN", "tok-SECRET-1")
    monkeypatch.setenv("BISECT_DATABASE_URL", "postgresql://u:pw-SECRET-2@db/x")
    report = execute_trial(
        spec(fixture_index, variables={"HF_HUB_OFFLINE": "1", "MY_FLAG": "yes"}),
        env_root=env_root,
        cache_dir=uv_cache,
    )
    assert report.exit_code == 0, report.log_tail
    probe = json.loads(report.log_tail)
    env = probe["env"]
    work = Path(probe["cwd"])
    assert (env["HF_HUB_OFFLINE"], env["MY_FLAG"]) == ("1", "yes")
    assert (env["HOME"], env["TMPDIR"]) == (str(work / "home"), str(work / "tmp"))
    assert not [k for k in env if k.startswith("BISECT_")]
    assert "SECRET" not in json.dumps(env)
    assert probe["cwd_mode"] == 0o700
    trial = identities().trial
    if trial is not None:  # a slot user of the pool (leakbisect-trial-N), owning its work dir
        assert probe["uid"] == probe["cwd_uid"]
        assert re.fullmatch(rf"{trial.name}-\d+", pwd.getpwuid(probe["uid"]).pw_name)
    assert not work.exists()  # removed after the trial
    assert report.samples_taken == len(report.samples) > 0


def test_a_bisect_variable_is_refused_and_nothing_runs(
    fixture_index: str, env_root: Path, uv_cache: Path
) -> None:
    report = execute_trial(
        spec(fixture_index, variables={"BISECT_RUNNER_TOKEN": "x"}),
        env_root=env_root,
        cache_dir=uv_cache,
    )
    assert report.env.ok and report.exit_code is None and report.samples == []
    assert report.error == (
        "variables: BISECT_RUNNER_TOKEN is reserved: names starting with BISECT_ are the "
        "runner's own settings and never reach a script"
    )


def test_resolve_trials_report_pins(fixture_index: str, env_root: Path, uv_cache: Path) -> None:
    ok = execute_trial(spec(fixture_index, kind="resolve"), env_root=env_root, cache_dir=uv_cache)
    assert ok.env.ok and ok.pins == ["leakyfixture==1.0.2"]
    assert ok.exit_code is None and ok.samples == [] and ok.samples_taken is None
    assert not env_root.exists() or list(env_root.iterdir()) == []  # nothing was built
    foreign = spec(fixture_index, kind="resolve").model_copy(
        update={"env": EnvSpec(package="leakyfixture", version="1.0.4", index_url=fixture_index)}
    )
    bad = execute_trial(foreign, env_root=env_root, cache_dir=uv_cache)
    assert not bad.env.ok and bad.pins is None
    assert bad.env.error.startswith("cannot resolve leakyfixture==1.0.4: Because ")


def test_reports_are_downsampled_to_the_maximum() -> None:
    samples = [Sample(t=i * 0.02, rss=2**20 + (i % 100) * 4096) for i in range(30_000)]
    run = Execution(
        exit_code=0, oom_killed=False, timed_out=False, cap_method="watchdog",
        duration_s=600.0, log_tail="", samples=samples,
    )  # fmt: skip
    report = _report(TrialSpec(trial_id=1, env=EnvSpec(package="p", version="1"), script=""),
                     EnvResult(ok=True), run)  # fmt: skip
    assert len(report.samples) <= MAX_REPORT_SAMPLES
    assert report.samples_taken == 30_000
    assert max(s.rss for s in report.samples) == max(s.rss for s in samples)
    assert min(s.rss for s in report.samples) == min(s.rss for s in samples)


# --------------------------------------------------------------------------- build backends

BACKEND = """
import base64, hashlib, json, os, zipfile

DROP = {drop!r}


def _probe(hook):
    with open(os.path.join(DROP, hook + ".json"), "w") as f:
        json.dump({{"env": dict(os.environ), "uid": os.getuid(), "cwd": os.getcwd()}}, f)


def get_requires_for_build_wheel(config_settings=None):
    _probe("get_requires_for_build_wheel")
    return []


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    _probe("build_wheel")
    dist = "envprobe-1.0.dist-info"
    files = {{
        "envprobe/__init__.py": b"",
        dist + "/METADATA": b"Metadata-Version: 2.1\\nName: envprobe\\nVersion: 1.0\\n",
        dist + "/WHEEL": (
            b"Wheel-Version: 1.0\\nGenerator: t\\nRoot-Is-Purelib: true\\nTag: py3-none-any\\n"
        ),
    }}
    record = []
    for name, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{{name}},sha256={{digest}},{{len(data)}}")
    record.append(dist + "/RECORD,,")
    files[dist + "/RECORD"] = ("\\n".join(record) + "\\n").encode()
    name = "envprobe-1.0-py3-none-any.whl"
    with zipfile.ZipFile(os.path.join(wheel_directory, name), "w") as zf:
        for path, data in files.items():
            zf.writestr(path, data)
    return name
"""


def _sdist(dest: Path, drop: Path) -> Path:
    """``envprobe-1.0.tar.gz`` whose in-tree build backend writes its environment to `drop`."""
    members = {
        "pyproject.toml": textwrap.dedent(
            """
            [build-system]
            requires = []
            build-backend = "backend"
            backend-path = ["."]
            [project]
            name = "envprobe"
            version = "1.0"
            """
        ),
        "backend.py": BACKEND.format(drop=str(drop)),
        "PKG-INFO": "Metadata-Version: 2.1\nName: envprobe\nVersion: 1.0\n",
    }
    path = dest / "envprobe-1.0.tar.gz"
    with tarfile.open(path, "w:gz") as tar:
        for name, text in members.items():
            data = text.encode()
            info = tarfile.TarInfo(f"envprobe-1.0/{name}")
            info.size = len(data)
            info.mode = 0o644
            tar.addfile(info, io.BytesIO(data))
    return path


def test_build_backends_see_no_runner_secrets(
    fixture_index: str, reachable_tmp: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("BISECT_RUNNER_TOKEN", "tok-SECRET-3")
    monkeypatch.setenv("BISECT_API_TOKENS", "api-SECRET-4")
    drop = reachable_tmp / "drop"
    drop.mkdir(mode=0o777)
    drop.chmod(0o777)  # the build user writes its probes here
    links = reachable_tmp / "links"
    links.mkdir(mode=0o755)
    _sdist(links, drop)
    envspec = EnvSpec(
        package="envprobe", version="1.0", index_url=fixture_index, find_links=[str(links)]
    )
    trial = TrialSpec(trial_id=9, env=envspec, script="print('built')", timeout_s=120)
    report = execute_trial(
        trial, env_root=reachable_tmp / "envs", cache_dir=reachable_tmp / "uv-cache"
    )
    assert report.env.ok, report.env.error
    assert report.log_tail == "built\n"
    probes = sorted(p.name for p in drop.iterdir())
    assert probes == ["build_wheel.json", "get_requires_for_build_wheel.json"]
    build = identities().build
    for name in probes:
        probe = json.loads((drop / name).read_text())
        assert not [k for k in probe["env"] if k.startswith("BISECT_")], name
        assert "SECRET" not in json.dumps(probe["env"]), name
        assert probe["env"]["HOME"].startswith("/tmp/leakbisect-build-"), probe["env"]["HOME"]
        assert probe["uid"] == (build.uid if build is not None else os.getuid())



def test_each_owner_builds_its_own_environment(
    fixture_index: str, env_root: Path, uv_cache: Path
) -> None:
    # The trial passes its job's owner to the build: one owner's environment (and uv cache)
    # is never handed to another's trial (issue 24 row 2).
    paths = {}
    for owner in ("alice", "bob", "alice"):
        report = execute_trial(spec(fixture_index, owner=owner, script="print('ok')"),
                               env_root=env_root, cache_dir=uv_cache)  # fmt: skip
        assert report.exit_code == 0, report.log_tail
        paths.setdefault(owner, []).append((report.env.path, report.env.reused))
    (alice, alice_again), (bob,) = paths["alice"], paths["bob"]
    assert alice[0] == alice_again[0] != bob[0]
    assert (alice[1], bob[1], alice_again[1]) == (False, False, True)
    assert Path(alice[0]).parent.name == owner_key("alice")
    assert Path(bob[0]).parent.name == owner_key("bob")
