# The runner image: Python, uv (the version pinned in uv.lock) and the leakbisect agent.
# Each trial runs in a container of this image (runners/docker/executor.py); the agent itself can run
# in one too (compose.yaml). No tokens are baked in: they come from the environment at run time.
#
#   docker build -f dockerfiles/runner.Dockerfile -t leakbisect-runner .
#   GPU hosts: --build-arg BASE_IMAGE=nvidia/cuda:12.4.1-runtime-ubuntu22.04 (needs python3 there)
#   Offline:   --build-arg BASE_IMAGE=leakbisect-base:bookworm (dockerfiles/build-base.sh)
ARG BASE_IMAGE=python:3.11-slim-bookworm
FROM ${BASE_IMAGE}
ARG UV_VERSION=0.13.9

# A proxy's CA bundle, when the build context carries one (runners/docker/images.py adds
# the file SSL_CERT_FILE names as dockerfiles/ca/ca-bundle.pem); otherwise the base's own.
COPY dockerfiles/install-uv.py dockerfiles/ca/ /tmp/leakbisect-build/
RUN set -eu; \
    if [ -f /tmp/leakbisect-build/ca-bundle.pem ]; then \
        mkdir -p /etc/leakbisect && cp /tmp/leakbisect-build/ca-bundle.pem /etc/leakbisect/ca-bundle.pem; \
    fi; \
    ca=/etc/leakbisect/ca-bundle.pem; [ -f "$ca" ] || ca=/etc/ssl/certs/ca-certificates.crt; \
    SSL_CERT_FILE="$ca" python3 /tmp/leakbisect-build/install-uv.py "$UV_VERSION"

# git for commits trials (runners/commits.py) and uv's builds from a commit; the offline
# base has it already, a python:*-slim base gets it from Debian.
RUN set -eu; command -v git >/dev/null || { apt-get update -q \
    && apt-get install -y -q --no-install-recommends git && rm -rf /var/lib/apt/lists/*; }

# The sandbox users (runners/docker/spec.py: BUILD_UID, TRIAL_UID) and the volume mount
# points, owned by the build user so new named volumes start out writable by it.
RUN set -eu; \
    groupadd --gid 10001 leakbisect-build; useradd --uid 10001 --gid 10001 --no-create-home --shell /usr/sbin/nologin leakbisect-build; \
    groupadd --gid 10002 leakbisect-trial; useradd --uid 10002 --gid 10002 --no-create-home --shell /usr/sbin/nologin leakbisect-trial; \
    mkdir -p /var/cache/leakbisect/uv /var/cache/leakbisect/envs /envs /trial; \
    chown 10001:10001 /var/cache/leakbisect /var/cache/leakbisect/uv /var/cache/leakbisect/envs /envs; \
    chmod 0755 /var/cache/leakbisect /var/cache/leakbisect/uv /var/cache/leakbisect/envs /envs

WORKDIR /opt/leakbisect
COPY pyproject.toml uv.lock README.md ./
# The runner extra only: the agent and the trial entry import no server package.
RUN set -eu; \
    ca=/etc/leakbisect/ca-bundle.pem; [ -f "$ca" ] || ca=/etc/ssl/certs/ca-certificates.crt; \
    SSL_CERT_FILE="$ca" UV_NATIVE_TLS=1 UV_CACHE_DIR=/tmp/uv-cache UV_PYTHON_DOWNLOADS=never \
        UV_PROJECT_ENVIRONMENT=/opt/leakbisect/.venv UV_LINK_MODE=copy UV_COMPILE_BYTECODE=1 \
        uv sync --locked --no-dev --no-install-project --extra runner --python python3; \
    rm -rf /tmp/uv-cache /tmp/leakbisect-build
# The project itself as its editable install would be (a .pth file and the console
# script), then the code last: a code change rebuilds only the COPY layers (about 1 s).
RUN set -eu; \
    venv=/opt/leakbisect/.venv; \
    site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])'); \
    echo /opt/leakbisect > "$site/leakbisect.pth"; \
    printf '#!%s/bin/python\nimport sys\nfrom service.cli import main\nsys.exit(main())\n' "$venv" \
        > "$venv/bin/bisect-cli"; \
    chmod 0755 "$venv/bin/bisect-cli"
COPY contract/ contract/
COPY engine/ engine/
COPY runners/ runners/
COPY service/ service/
COPY migrations/ migrations/
# Nothing named BISECT_* here: image variables reach every container of the image.
ENV PATH=/opt/leakbisect/.venv/bin:/usr/local/bin:/usr/bin:/bin LANG=C.UTF-8
CMD ["bisect-cli", "runner", "--executor", "docker"]
