#!/usr/bin/env bash
# The CI step that action.yml (GitHub) and ci/gitlab/leakbisect.yml (GitLab) both run:
# `bisect-cli ci` from this checkout of leakbisect, with its locked dependencies (uv.lock),
# so no published package is needed. Its own arguments (--forge, ...) come first; the inputs
# come from the environment, never pasted into a script:
#   BISECT_SERVER, BISECT_TOKEN, BISECT_OIDC_AUDIENCE    read by bisect-cli itself
#   LEAKBISECT_SCRIPT, _PACKAGE, _RANGE, _JOB, _COMMENT (true/false), _COMMENT_KEY, _PR,
#   _EXIT_ON, and _ARGS: more options as on a command line (quotes group words; nothing
#   is expanded: xargs splits them, no shell evaluates them)
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# The client's environment lives in leakbisect's folder, whatever the pipeline sets.
export UV_PROJECT_ENVIRONMENT="$here/.venv"
# uv, unless the CI has it (on GitHub, astral-sh/setup-uv is an optional earlier step).
uv=(uv)
if ! command -v uv >/dev/null 2>&1; then
  PIP_BREAK_SYSTEM_PACKAGES=1 python3 -m pip install --quiet --user uv
  uv=(python3 -m uv)
fi
args=("$@")
if [ -n "${LEAKBISECT_SCRIPT:-}" ]; then args+=("$LEAKBISECT_SCRIPT"); fi
if [ -n "${LEAKBISECT_PACKAGE:-}" ]; then args+=(--package "$LEAKBISECT_PACKAGE"); fi
if [ -n "${LEAKBISECT_RANGE:-}" ]; then args+=(--range "$LEAKBISECT_RANGE"); fi
if [ -n "${LEAKBISECT_JOB:-}" ]; then args+=(--job "$LEAKBISECT_JOB"); fi
if [ "${LEAKBISECT_COMMENT:-false}" = "true" ]; then args+=(--comment); fi
if [ -n "${LEAKBISECT_COMMENT_KEY:-}" ]; then args+=(--comment-key "$LEAKBISECT_COMMENT_KEY"); fi
if [ -n "${LEAKBISECT_PR:-}" ]; then args+=(--pr "$LEAKBISECT_PR"); fi
if [ -n "${LEAKBISECT_EXIT_ON:-}" ]; then args+=(--exit-on "$LEAKBISECT_EXIT_ON"); fi
mapfile -t extra < <(printf '%s' "${LEAKBISECT_ARGS:-}" | xargs -r -n1 printf '%s\n')
exec "${uv[@]}" run --quiet --project "$here" --locked --no-dev \
  bisect-cli ci "${args[@]}" "${extra[@]}"
