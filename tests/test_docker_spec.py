"""The trial containers' settings, exactly (pure: no engine needed)."""

from __future__ import annotations

import pytest
from docker.types import DeviceRequest

from contract.errors import InvalidInput
from contract.wire import EnvSpec
from runners.docker.cgroup import Counters, find, parse_keyed
from runners.docker.spec import (
    CA_MOUNT,
    DockerSettings,
    build_kwargs,
    parse_result,
    run_kwargs,
    script_env,
)
from runners.docker.watch import _exit_code
from runners.publish import owner_key

SETTINGS = DockerSettings(image="img:1", runner_name="r1", cache_volume="cache")
MiB = 1 << 20


def test_the_build_phase_has_the_host_network_and_the_cache_volume() -> None:
    kw = build_kwargs(SETTINGS, 7, 2, "run", EnvSpec(package="p", version="1"))
    assert kw["network_mode"] == "host"
    assert kw["user"] == "10001:10001"
    assert kw["volumes"] == {"cache": {"bind": "/var/cache/leakbisect", "mode": "rw"}}
    assert kw["environment"]["UV_CACHE_DIR"] == "/var/cache/leakbisect/uv"
    assert "UV_LINK_MODE" not in kw["environment"]  # envs in the cache volume: hard links
    assert kw["command"][3:5] == ["build", "/var/cache/leakbisect/envs"]
    assert kw["labels"] == {"leakbisect.runner": "r1", "leakbisect.trial": "7.2",
                            "leakbisect.phase": "build"}  # fmt: skip
    assert kw["cap_drop"] == ["ALL"] and kw["read_only"] is True


def test_a_separate_env_volume_copies_and_a_ca_bundle_is_mounted() -> None:
    s = DockerSettings(image="i", runner_name="r", cache_volume="c", env_volume="e",
                       ca_bundle="/etc/ssl/ca.pem")  # fmt: skip
    kw = build_kwargs(s, 1, 1, "resolve", EnvSpec(package="p", version="1"))
    assert kw["environment"]["UV_LINK_MODE"] == "copy"
    assert kw["environment"]["SSL_CERT_FILE"] == CA_MOUNT
    assert kw["environment"]["UV_NATIVE_TLS"] == "1"
    assert kw["volumes"]["e"] == {"bind": "/envs", "mode": "rw"}
    assert kw["volumes"]["/etc/ssl/ca.pem"] == {"bind": CA_MOUNT, "mode": "ro"}
    assert kw["command"][3:5] == ["resolve", "/envs"]


def test_each_owner_builds_and_runs_on_volumes_of_its_own() -> None:
    # A build container runs as the build uid, not root: it cannot publish environments
    # read-only, so what one owner's build backend can rewrite must be its owner's alone.
    s = DockerSettings(image="i", runner_name="r", cache_volume="c", env_volume="e")
    env = EnvSpec(package="p", version="1")
    alice = build_kwargs(s, 1, 1, "run", env, owner="alice")["volumes"]
    bob = build_kwargs(s, 2, 1, "run", env, owner="bob")["volumes"]
    key = owner_key("alice")
    assert alice == {f"c-{key}": {"bind": "/var/cache/leakbisect", "mode": "rw"},
                     f"e-{key}": {"bind": "/envs", "mode": "rw"}}  # fmt: skip
    assert set(alice).isdisjoint(bob)
    run = run_kwargs(s, 1, 1, python="/envs/x/bin/python", script_name="repro.py",
                     memory_limit_bytes=MiB << 8, variables={}, owner="alice")  # fmt: skip
    assert run["volumes"] == {name: {**v, "mode": "ro"} for name, v in alice.items()}


def test_the_run_phase_is_offline_capped_unprivileged_and_read_only() -> None:
    kw = run_kwargs(SETTINGS, 7, 1, python="/envs/x/bin/python", script_name="repro.py",
                    memory_limit_bytes=200 * MiB, variables={"A": "1"})  # fmt: skip
    assert kw["network_mode"] == "none"
    assert kw["user"] == "10002:10002"
    assert kw["mem_limit"] == kw["memswap_limit"] == 200 * MiB
    assert kw["cap_drop"] == ["ALL"]
    assert kw["security_opt"] == ["no-new-privileges"]
    assert kw["pids_limit"] > 0
    assert kw["read_only"] is True
    assert kw["volumes"] == {"cache": {"bind": "/var/cache/leakbisect", "mode": "ro"}}
    assert kw["environment"]["UV_OFFLINE"] == "1"
    assert kw["environment"]["A"] == "1"
    assert "device_requests" not in kw
    assert kw["command"][-2:] == ["/envs/x/bin/python", "/trial/work/repro.py"]


def test_the_script_environment_is_the_allowlist_only(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BISECT_RUNNER_TOKEN", "secret")
    env = script_env(SETTINGS, {"MY": "x"})
    assert env == {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8",
                   "HOME": "/trial/work/home", "TMPDIR": "/trial/work/tmp",
                   "PYTHONUNBUFFERED": "1", "MY": "x", "UV_OFFLINE": "1"}  # fmt: skip
    with pytest.raises(InvalidInput, match="BISECT_X is reserved"):
        script_env(SETTINGS, {"BISECT_X": "1"})


def test_a_gpu_trial_asks_for_exactly_its_gpu() -> None:
    kw = run_kwargs(SETTINGS, 1, 1, python="p", script_name="s.py", memory_limit_bytes=MiB * 64,
                    variables={}, gpu_uuids=["GPU-abc"])  # fmt: skip
    assert kw["device_requests"] == [
        DeviceRequest(device_ids=["GPU-abc"], capabilities=[["gpu", "compute", "utility"]])
    ]


@pytest.mark.parametrize(
    ("reported", "status", "oom", "killed", "code"),
    [
        (0, 0, False, False, 0),
        (125, 0, False, False, 125),
        (-9, 137, True, False, -9),  # the OOM killer got the script
        (None, 137, False, False, -9),  # 137 without OOM evidence: a kill, not an OOM
        (None, 137, True, False, -9),
        (None, 143, False, False, -15),
        (None, 1, False, False, 1),
        (0, 0, False, True, -9),  # killed while the entry reported
    ],
)
def test_exit_codes(reported: int | None, status: int, oom: bool, killed: bool, code: int) -> None:
    assert _exit_code(reported, status, oom, killed) == code


def test_parse_result_takes_the_last_json_line() -> None:
    assert parse_result('noise\n{"ok": true}\n') == {"ok": True}
    assert parse_result("no json here") is None


def test_cgroup_v1_and_v2_counters(tmp_path) -> None:  # type: ignore[no-untyped-def]
    v1 = tmp_path / "memory" / "docker" / "abc"
    v1.mkdir(parents=True)
    (v1 / "memory.usage_in_bytes").write_text("1000\n")
    (v1 / "memory.stat").write_text("rss 1\ntotal_rss 600\ntotal_cache 300\ntotal_shmem 50\n"
                                    "total_mapped_file 100\n")  # fmt: skip
    (v1 / "memory.oom_control").write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 2\n")
    (v1 / "cgroup.procs").write_text("11\n12\n")
    cg = find("abc", tmp_path)
    assert cg is not None and cg.source == "cgroup-v1"
    assert cg.read() == Counters(usage=1000, anon=600, file=300, shmem=50, mapped=100,
                                 oom_kill=2, peak=None)  # fmt: skip
    assert cg.read().rss == 700  # type: ignore[union-attr]
    assert cg.pids() == [11, 12]
    v2 = tmp_path / "docker" / "def"
    v2.mkdir(parents=True)
    (v2 / "memory.current").write_text("2000\n")
    (v2 / "memory.stat").write_text("anon 900\nfile 500\nshmem 10\nfile_mapped 20\n")
    (v2 / "memory.events").write_text("low 0\nhigh 0\nmax 3\noom 1\noom_kill 1\n")
    (v2 / "memory.peak").write_text("2500\n")
    cg2 = find("def", tmp_path)
    assert cg2 is not None and cg2.source == "cgroup-v2"
    assert cg2.read() == Counters(usage=2000, anon=900, file=500, shmem=10, mapped=20,
                                  oom_kill=1, peak=2500)  # fmt: skip
    assert find("nope", tmp_path) is None
    assert parse_keyed("a 1\nb x\n") == {"a": 1}


def test_no_engine_is_one_line_and_exit_1(monkeypatch: pytest.MonkeyPatch) -> None:
    from typer.testing import CliRunner

    from service.cli import app

    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")
    result = CliRunner().invoke(
        app, ["runner", "--executor", "docker", "--server", "http://127.0.0.1:9"]
    )
    assert result.exit_code == 1
    lines = result.output.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith("error: --executor docker: no Docker engine reachable (")


def test_an_unknown_executor_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    from typer.testing import CliRunner

    from service.cli import app

    result = CliRunner().invoke(app, ["runner", "--executor", "podman"])
    assert result.exit_code == 2
    assert "--executor" in result.output


def test_the_entry_runs_every_tracer_the_wire_names() -> None:
    # docker_entry spells the tracers out (its run phase does not import pydantic).
    from contract import wire
    from runners.docker import entry as docker_entry

    assert docker_entry.TRACERS == wire.TRACERS == ("memray", "tracemalloc")  # cheaper first
