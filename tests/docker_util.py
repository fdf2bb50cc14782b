"""The Docker engine and images the container tests need, or why not.

Outside CI a missing engine or image skips those tests with the reason; in CI
(``CI=true``, where `.ci/run` starts dockerd and builds the images) it fails them: a
container test that did not run there is a failure, never a skip.
"""

from __future__ import annotations

import os
from typing import Any

import pytest

from runners.docker.images import API_IMAGE, RUNNER_IMAGE


def unavailable(why: str) -> None:
    if os.environ.get("CI") == "true":
        pytest.fail(f"CI must run the container tests: {why}")
    pytest.skip(why)


def engine(*images: str) -> Any:
    """A docker client with `images` present (default: the runner image)."""
    try:
        import docker

        client = docker.from_env()
        client.ping()
    except Exception as exc:  # noqa: BLE001 - any failure means no engine
        unavailable(f"no Docker engine: {str(exc).splitlines()[0][:200]}")
    for image in images or (RUNNER_IMAGE,):
        try:
            client.images.get(image)
        except Exception:  # noqa: BLE001
            unavailable(
                f"image {image} missing: dockerfiles/build-base.sh && "
                "uv run python -m runners.docker.images"
            )
    return client


__all__ = ["API_IMAGE", "RUNNER_IMAGE", "engine", "unavailable"]
