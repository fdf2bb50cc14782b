"""Install one uv release from PyPI (or UV_INDEX_URL) into /usr/local/bin; sha256 checked.

Used by the Dockerfiles (no pip or uv in a bare base image): python3 install-uv.py VERSION.
TLS uses SSL_CERT_FILE when set (a proxy's CA bundle passed into the build).
"""

import hashlib
import io
import json
import os
import platform
import stat
import sys
import urllib.request
import zipfile

INDEX = os.environ.get("UV_INDEX_URL", "https://pypi.org/simple").rstrip("/")
ARCH = {"x86_64": "x86_64", "amd64": "x86_64", "aarch64": "aarch64", "arm64": "aarch64"}


def main(version: str, dest: str = "/usr/local/bin/uv") -> None:
    arch = ARCH[platform.machine().lower()]
    # The PEP 691 JSON simple index: what every index (PyPI or a mirror) serves.
    request = urllib.request.Request(
        f"{INDEX}/uv/", headers={"Accept": "application/vnd.pypi.simple.v1+json"}
    )
    files = json.load(urllib.request.urlopen(request))["files"]
    prefix = f"uv-{version}-"
    wheels = [
        f for f in files
        if f["filename"].startswith(prefix) and f["filename"].endswith(".whl")
        and "manylinux" in f["filename"] and arch in f["filename"]
    ]
    if not wheels:
        sys.exit(f"no manylinux {arch} wheel of uv {version}")
    wheel = wheels[0]
    data = urllib.request.urlopen(wheel["url"]).read()
    if hashlib.sha256(data).hexdigest() != wheel["hashes"]["sha256"]:
        sys.exit(f"{wheel['filename']}: sha256 mismatch")
    with zipfile.ZipFile(io.BytesIO(data)) as z:
        name = next(n for n in z.namelist() if n.endswith(".data/scripts/uv"))
        with open(dest, "wb") as out:
            out.write(z.read(name))
    mode = stat.S_IRWXU | stat.S_IRGRP | stat.S_IXGRP | stat.S_IROTH | stat.S_IXOTH
    os.chmod(dest, mode)
    print(f"uv {version} from {wheel['filename']}")


if __name__ == "__main__":
    main(*sys.argv[1:])
