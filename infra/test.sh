#!/usr/bin/env bash
# The test command of sas: installs and starts the AWS API emulator (moto) on a free loopback
# port, runs formatting, lints and every test against it, and stops the emulator on exit.
# Needs only a Rust toolchain and python3. Tests that need the emulator fail without it.
set -euo pipefail
cd "$(dirname "$0")/.."

MOTO_VERSION="5.2.5"
VENV="${SAS_VENV:-.venv}"

installed_moto() {
  "$VENV/bin/python" -c 'import importlib.metadata as m; print(m.version("moto"))' 2>/dev/null || true
}
if [ ! -x "$VENV/bin/moto_server" ] || [ "$(installed_moto)" != "$MOTO_VERSION" ]; then
  echo "==> installing moto[server]==$MOTO_VERSION into $VENV"
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install --quiet --disable-pip-version-check "moto[server]==$MOTO_VERSION"
fi

PORT="$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()')"
mkdir -p target
"$VENV/bin/moto_server" -H 127.0.0.1 -p "$PORT" >target/moto.log 2>&1 &
MOTO_PID=$!
cleanup() {
  kill "$MOTO_PID" 2>/dev/null || true
  wait "$MOTO_PID" 2>/dev/null || true
}
trap cleanup EXIT

python3 - "$PORT" <<'PY'
import sys, time, urllib.request
url = f"http://127.0.0.1:{sys.argv[1]}/moto-api/"
for _ in range(200):
    try:
        urllib.request.urlopen(url, timeout=1)
        sys.exit(0)
    except Exception:
        time.sleep(0.1)
sys.exit(f"the emulator did not answer at {url}")
PY
echo "==> moto $MOTO_VERSION on 127.0.0.1:$PORT (pid $MOTO_PID)"

# Loopback only: dummy credentials, and every SDK client pointed at the emulator.
export SAS_TEST_ENDPOINT="http://127.0.0.1:$PORT"
export AWS_ENDPOINT_URL="$SAS_TEST_ENDPOINT"
export AWS_ACCESS_KEY_ID=test AWS_SECRET_ACCESS_KEY=test AWS_REGION=us-east-1
export AWS_EC2_METADATA_DISABLED=true
unset AWS_PROFILE AWS_SESSION_TOKEN

echo "==> cargo fmt --check"
cargo fmt --all --check
echo "==> cargo clippy --all-targets -- -D warnings"
cargo clippy --workspace --all-targets -- -D warnings
echo "==> cargo test"
start=$(date +%s)
cargo test --workspace
echo "==> all tests passed ($(( $(date +%s) - start ))s for the test step)"
