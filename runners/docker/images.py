"""Build the runner and API images with the docker SDK (no docker CLI needed).

    uv run python -m runners.docker.images [--base TAG] [--only runner|api] [--force]

The build context is the project (pyproject.toml, uv.lock, README.md, contract/, engine/,
runners/, service/, migrations/, dockerfiles/) plus, when ``SSL_CERT_FILE`` names a file,
that CA bundle as ``dockerfiles/ca/ca-bundle.pem``, so uv inside the build trusts the same
proxy the host does.
Builds use the host network (``network_mode="host"``): never a bridge network. The base is
``--base`` (default ``leakbisect-base:bookworm``, built offline by
``dockerfiles/build-base.sh``); uv is the version uv.lock pins. An image that exists is
kept unless ``--force``. Prints one line per image: its tag, size and build seconds.
"""

from __future__ import annotations

import argparse
import io
import os
import re
import tarfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]  # the project: runners/docker/ is two down
BASE_IMAGE = "leakbisect-base:bookworm"
RUNNER_IMAGE = "leakbisect-runner:latest"
API_IMAGE = "leakbisect-api:latest"
CONTEXT = ("pyproject.toml", "uv.lock", "README.md", "contract", "engine", "runners", "service",
           "migrations", "dockerfiles")  # fmt: skip
_SKIP = re.compile(r"(__pycache__|\.pyc$|\.pytest_cache|ca-bundle\.pem$)")


def locked_uv_version(lock: Path = ROOT / "uv.lock") -> str:
    """The uv version uv.lock pins (the image gets exactly that one)."""
    match = re.search(r'\[\[package\]\]\nname = "uv"\nversion = "([^"]+)"', lock.read_text())
    if match is None:
        raise ValueError(f"{lock}: no uv package")
    return match.group(1)


def context_tar(root: Path = ROOT, ca_bundle: str | None = None) -> io.BytesIO:
    """The build context as a tar stream, with the CA bundle when given."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name in CONTEXT:
            tar.add(root / name, arcname=name, filter=lambda t: None if _SKIP.search(t.name) else t)
        if ca_bundle and Path(ca_bundle).is_file():
            tar.add(ca_bundle, arcname="dockerfiles/ca/ca-bundle.pem")
    buf.seek(0)
    return buf


def build_image(client: Any, dockerfile: str, tag: str, base: str, force: bool = False) -> str:
    """Build one image unless it exists; one line: tag, size, seconds."""
    from docker.errors import BuildError, ImageNotFound

    if not force:
        try:
            image = client.images.get(tag)
            return f"{tag}: exists ({image.attrs['Size'] / 1e6:.0f} MB)"
        except ImageNotFound:
            pass
    started = time.monotonic()
    try:
        image, _logs = client.images.build(
            fileobj=context_tar(ca_bundle=os.environ.get("SSL_CERT_FILE")),
            custom_context=True,
            dockerfile=f"dockerfiles/{dockerfile}",
            tag=tag,
            buildargs={"BASE_IMAGE": base, "UV_VERSION": locked_uv_version()},
            network_mode="host",
            rm=True,
            forcerm=True,
        )
    except BuildError as exc:  # the build's own output says why
        tail = "".join(c.get("stream", "") for c in exc.build_log)[-2000:]
        raise SystemExit(f"{tag}: build failed: {exc.msg}\n{tail}") from None
    seconds = time.monotonic() - started
    return f"{tag}: built in {seconds:.0f} s ({image.attrs['Size'] / 1e6:.0f} MB)"


def main(argv: list[str] | None = None) -> None:
    import docker

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", default=BASE_IMAGE, help="BASE_IMAGE of both Dockerfiles")
    parser.add_argument("--only", choices=["runner", "api"], help="build one image only")
    parser.add_argument("--force", action="store_true", help="rebuild images that exist")
    args = parser.parse_args(argv)
    client = docker.from_env()
    wanted = [("runner", "runner.Dockerfile", RUNNER_IMAGE), ("api", "api.Dockerfile", API_IMAGE)]
    for what, dockerfile, tag in wanted:
        if args.only in (None, what):
            print(build_image(client, dockerfile, tag, args.base, args.force), flush=True)


if __name__ == "__main__":
    main()
