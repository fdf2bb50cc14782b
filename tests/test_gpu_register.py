"""A runner's GPU, as the agent describes it, registered through the REST API; GPU jobs go
only to runners that have one. The GPU is the FAKE NVML (tests/fake_nvml.py)."""

from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlmodel import Session

from runners.agent import describe_capabilities
from runners.nvml import GpuProbe
from service.app import create_app
from service.db import get_engine
from service.models import Runner
from service.settings import Settings
from tests.fake_nvml import FakeDevice, FakeNvml

API = "/api/v1"
GiB = 2**30


@pytest.fixture
def client(tmp_path: Path, uv_cache: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[TestClient]:
    monkeypatch.setenv("UV_CACHE_DIR", str(uv_cache))
    settings = Settings(
        database_url=f"sqlite:///{tmp_path / 'api.db'}",
        data_dir=tmp_path / "data",
        cache_dir=tmp_path / "cache",
        reap_interval_s=0,
        trusted_hosts=["testserver"],  # the TestClient's Host
    )
    with TestClient(create_app(settings)) as c:
        yield c


def register(client: TestClient, name: str, probe: GpuProbe | None) -> str:
    caps = describe_capabilities(probe)
    body = {"name": name, "capabilities": caps.model_dump(mode="json")}
    response = client.post(f"{API}/runners", json=body)
    assert response.status_code == 201, response.text
    SECRETS[response.json()["runner_id"]] = response.json()["runner_secret"]
    return response.json()["runner_id"]


SECRETS: dict[str, str] = {}  # runner id -> the secret its registration returned


def lease(client: TestClient, runner_id: str) -> dict | None:
    secret = {"X-Runner-Secret": SECRETS[runner_id]}
    response = client.post(
        f"{API}/runners/{runner_id}/lease", params={"wait": 0}, json={}, headers=secret
    )
    if response.status_code == 204:
        return None
    assert response.status_code == 200, response.text
    return response.json()


def test_gpu_model_memory_driver_and_cuda_are_registered(
    client: TestClient, fixture_index: str, tmp_path: Path
) -> None:
    fake = FakeNvml(
        [FakeDevice(name="Fake H200", uuid="GPU-h200", total=141 * GiB)],
        driver_version="560.35.03",
        cuda_driver_version=12060,
    )
    gpu = register(client, "gpu-runner", GpuProbe.open(fake))
    cpu = register(client, "cpu-runner", None)

    with Session(get_engine(f"sqlite:///{tmp_path / 'api.db'}")) as session:
        row = session.get(Runner, gpu)
        assert row is not None and row.gpu_count == 1
        assert row.capabilities["gpus"] == [
            {"name": "Fake H200", "memory_bytes": 141 * GiB, "uuid": "GPU-h200"}
        ]
        assert (row.capabilities["gpu_driver"], row.capabilities["cuda"]) == ("560.35.03", "12.6")
        cpu_row = session.get(Runner, cpu)
        assert cpu_row is not None and cpu_row.gpu_count == 0
        assert cpu_row.capabilities["gpus"] == [] and cpu_row.capabilities["gpu_driver"] is None

    job = {
        "package": "leakyfixture",
        "range": "1.0.0..1.0.9",
        "script": "import leakyfixture\n",
        "index_url": fixture_index,
        "requires_gpu": True,
    }
    created = client.post(f"{API}/jobs", json=job)
    assert created.status_code == 201, created.text
    assert lease(client, cpu) is None  # no GPU: never handed a GPU trial
    held = lease(client, gpu)
    assert held is not None
    assert held["trial"]["requires_gpu"] is True and held["trial"]["env"]["version"] == "1.0.0"
