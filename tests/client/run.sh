#!/usr/bin/env bash
# Runs a real-client test (tests/client/NAME.py ARGS...) in the Python environment that
# scripts/client_env.sh makes once per machine (or finds cached). An environment that cannot be
# made fails the test: it is never skipped.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
py=$(bash "$here/../../scripts/client_env.sh")
exec "$py" "$here/$1" "${@:2}"
