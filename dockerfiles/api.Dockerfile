# The API image: the leakbisect server (migrations run at start: `bisect-cli serve`).
# Tokens and the database URL come from the environment (compose.yaml reads .env).
#
#   docker build -f dockerfiles/api.Dockerfile -t leakbisect-api .
ARG BASE_IMAGE=python:3.11-slim-bookworm
FROM ${BASE_IMAGE}
ARG UV_VERSION=0.13.9

COPY dockerfiles/install-uv.py dockerfiles/ca/ /tmp/leakbisect-build/
RUN set -eu; \
    if [ -f /tmp/leakbisect-build/ca-bundle.pem ]; then \
        mkdir -p /etc/leakbisect && cp /tmp/leakbisect-build/ca-bundle.pem /etc/leakbisect/ca-bundle.pem; \
    fi; \
    ca=/etc/leakbisect/ca-bundle.pem; [ -f "$ca" ] || ca=/etc/ssl/certs/ca-certificates.crt; \
    SSL_CERT_FILE="$ca" python3 /tmp/leakbisect-build/install-uv.py "$UV_VERSION"

WORKDIR /opt/leakbisect
COPY pyproject.toml uv.lock README.md ./
# The server extra (the API, page, database; and the runner, which `serve` imports).
RUN set -eu; \
    ca=/etc/leakbisect/ca-bundle.pem; [ -f "$ca" ] || ca=/etc/ssl/certs/ca-certificates.crt; \
    SSL_CERT_FILE="$ca" UV_NATIVE_TLS=1 UV_CACHE_DIR=/tmp/uv-cache UV_PYTHON_DOWNLOADS=never \
        UV_PROJECT_ENVIRONMENT=/opt/leakbisect/.venv UV_LINK_MODE=copy UV_COMPILE_BYTECODE=1 \
        uv sync --locked --no-dev --no-install-project --extra server --python python3; \
    rm -rf /tmp/uv-cache /tmp/leakbisect-build; \
    groupadd --gid 10000 leakbisect; useradd --uid 10000 --gid 10000 --no-create-home --shell /usr/sbin/nologin leakbisect; \
    install -d -o 10000 -g 10000 -m 0700 /var/lib/leakbisect
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
# The data directory holds the session key when BISECT_SECRET_KEY is unset (the user has no home).
ENV PATH=/opt/leakbisect/.venv/bin:/usr/local/bin:/usr/bin:/bin LANG=C.UTF-8 \
    BISECT_DATA_DIR=/var/lib/leakbisect
USER 10000:10000
EXPOSE 8000
CMD ["bisect-cli", "serve", "--host", "0.0.0.0", "--port", "8000", "--runners", "0"]
