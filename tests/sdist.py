"""A hostile package for the trust-boundary tests: an sdist whose build backend is code.

`evil_sdist_index(dest, marker)` writes ``evilbuild-1.0.tar.gz``, a source distribution
with an in-tree PEP 517 backend (no build dependencies to fetch), and serves it as a
package index on 127.0.0.1. The moment any build hook runs, the backend writes the
environment it sees into `marker`, so a test can tell whether, where and with which
variables the code of a job's requirements ran.
"""

import io
import tarfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from service.example.index import serve_index

BACKEND = '''
import json, os, pathlib

def _caught():
    pathlib.Path({marker!r}).write_text(json.dumps({{"uid": os.getuid(), "env": dict(os.environ)}}))

def get_requires_for_build_wheel(config_settings=None):
    _caught()
    return []

def prepare_metadata_for_build_wheel(metadata_directory, config_settings=None):
    _caught()
    raise RuntimeError("evilbuild refuses to build")

def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    _caught()
    raise RuntimeError("evilbuild refuses to build")

get_requires_for_build_sdist = get_requires_for_build_wheel
'''

PYPROJECT = """
[build-system]
requires = []
build-backend = "backend"
backend-path = ["."]

[project]
name = "evilbuild"
version = "1.0"
"""


def write_sdist(dest: Path, marker: Path) -> Path:
    dest.mkdir(parents=True, exist_ok=True)
    path = dest / "evilbuild-1.0.tar.gz"
    files = {
        "evilbuild-1.0/pyproject.toml": PYPROJECT,
        "evilbuild-1.0/backend.py": BACKEND.format(marker=str(marker)),
        "evilbuild-1.0/PKG-INFO": "Metadata-Version: 2.1\nName: evilbuild\nVersion: 1.0\n",
    }
    with tarfile.open(path, "w:gz") as tar:
        for name, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


@contextmanager
def evil_sdist_index(dest: Path, marker: Path) -> Iterator[str]:
    write_sdist(dest, marker)
    with serve_index(dest) as url:
        yield url
