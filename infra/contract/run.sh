#!/usr/bin/env bash
# The API contract: docs/openapi.yaml must be valid OpenAPI 3.1 (openapi-spec-validator), and is
# held against one sas-local (`serve --auth iam`, a users file of its own):
#   1. Schemathesis generates requests for every operation of docs/openapi.yaml (SigV4-signed by
#      schemathesis_hooks.py) and fails on a 5xx, an undocumented status, an answer, header or
#      content type its schema does not allow, an accepted request the document forbids, or an
#      operation that ignores its authentication;
#   2. the Python client example (clients/python, botocore's SigV4);
#   3. the TypeScript client example (clients/typescript, @smithy/signature-v4), compiled by tsc.
# Usage: infra/contract/run.sh SAS_LOCAL_BINARY VENV
#   VENV: a virtualenv holding openapi-spec-validator, schemathesis and botocore (infra/test.sh installs it, pinned);
#   clients/typescript/node_modules must be installed (npm ci). sas-local is stopped by PID.
# SAS_CONTRACT_EXAMPLES (default 15) bounds Schemathesis's examples per operation and phase;
# SAS_CONTRACT_SEED (default 1) makes its run repeatable.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT="$PWD"
BIN="$(cd "$(dirname "$1")" && pwd)/$(basename "$1")"
VENV="$2"
WORK="$ROOT/target/contract"
rm -rf "$WORK" && mkdir -p "$WORK"
"$VENV/bin/openapi-spec-validator" docs/openapi.yaml

export AWS_ACCESS_KEY_ID=AKIASASCONTRACT AWS_SECRET_ACCESS_KEY=sas-contract-secret AWS_REGION=us-east-1
unset AWS_SESSION_TOKEN
cat >"$WORK/users.json" <<JSON
[{"accessKeyId": "$AWS_ACCESS_KEY_ID", "secretAccessKey": "$AWS_SECRET_ACCESS_KEY",
  "arn": "arn:aws:iam::000000000000:user/contract"}]
JSON
PORT="$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()')"
# In its own folder: no workflows/ there, so it publishes the built-in examples.
(cd "$WORK" && exec "$BIN" serve --auth iam --users users.json --listen "127.0.0.1:$PORT") \
  >"$WORK/sas-local.log" 2>&1 &
SAS_PID=$!
trap 'kill "$SAS_PID" 2>/dev/null || true; wait "$SAS_PID" 2>/dev/null || true' EXIT
python3 - "$PORT" <<'PY'
import socket, sys, time
for _ in range(300):
    try:
        socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=1).close()
        sys.exit(0)
    except OSError:
        time.sleep(0.1)
sys.exit("sas-local did not listen on 127.0.0.1:" + sys.argv[1])
PY
export SAS_URL="http://127.0.0.1:$PORT"
echo "==> contract: sas-local --auth iam on $SAS_URL (pid $SAS_PID)"

start=$(date +%s)
# positive_data_acceptance is left out: a body the document allows (any JSON as a task's input,
# any object as a definition) is still checked by the workflow's own schema and the catalog.
(cd "$WORK" && SAS_CONTRACT_ACCESS_KEY="$AWS_ACCESS_KEY_ID" \
  SAS_CONTRACT_SECRET_KEY="$AWS_SECRET_ACCESS_KEY" \
  PYTHONPATH="$ROOT/infra/contract" SCHEMATHESIS_HOOKS=schemathesis_hooks \
  "$VENV/bin/schemathesis" run "$ROOT/docs/openapi.yaml" --url "$SAS_URL" \
    --checks all --exclude-checks positive_data_acceptance \
    --max-examples "${SAS_CONTRACT_EXAMPLES:-15}" --seed "${SAS_CONTRACT_SEED:-1}" --workers 1 \
    --generation-database none --no-color --report junit --report-dir "$WORK")
echo "==> schemathesis passed ($(( $(date +%s) - start ))s)"

start=$(date +%s)
"$VENV/bin/python" clients/python/example.py
echo "==> the Python client example passed ($(( $(date +%s) - start ))s)"

start=$(date +%s)
(cd clients/typescript && npx --no-install tsc -p . && node dist/example.js)
echo "==> the TypeScript client example passed ($(( $(date +%s) - start ))s)"
