#!/usr/bin/env bash
# Publishes the example definitions (workflows/) through the LocalStack API Gateway URL of a
# stack deployed by infra/localstack-deploy.sh with sasctl, starts one loan application and
# polls it until it is Processed (or fails after a timeout). The stack is deployed with
# ApiAuth=None (infra/localstack-deploy.sh); the operator API is always IAM, and the operator
# function needs the IAM principal in the request context, which LocalStack fills only with
# IAM enforcement on (ENFORCE_IAM=1) and signed requests.
# Needs Docker with LocalStack running; CI checks this script's syntax only.
set -euo pipefail

ENDPOINT="${LOCALSTACK_ENDPOINT:-http://localhost:4566}"
STACK="${STACK_NAME:-sas-localstack}"
TIMEOUT="${TIMEOUT_SECONDS:-180}"
export AWS_ACCESS_KEY_ID="${AWS_ACCESS_KEY_ID:-test}" AWS_SECRET_ACCESS_KEY="${AWS_SECRET_ACCESS_KEY:-test}"
export AWS_DEFAULT_REGION="${AWS_DEFAULT_REGION:-us-east-1}"

api_id=$(awslocal cloudformation describe-stacks --stack-name "$STACK" \
  --query "Stacks[0].Outputs[?OutputKey=='HttpApiId'].OutputValue" --output text)
[ -n "$api_id" ] && [ "$api_id" != "None" ] || { echo "no HttpApiId output on stack $STACK" >&2; exit 1; }
port="${ENDPOINT##*:}"
api="http://$api_id.execute-api.localhost.localstack.cloud:$port"
echo "API: $api"

cd "$(dirname "$0")/.."
cargo run --quiet --release -p sasctl -- --endpoint "$api/operator" workflow apply workflows/

answer=$(curl -fsS -X POST "$api/workflows/loan-application/tasks" \
  -H 'Content-Type: application/json' \
  -H "Idempotency-Key: smoke-$(date +%s)" \
  -d '{"applicantId":"a-smoke","amount":25000,"currency":"EUR"}')
echo "POST /workflows/loan-application/tasks -> $answer"
task_id=$(python3 -c 'import json,sys; print(json.load(sys.stdin)["taskId"])' <<<"$answer")

deadline=$(( $(date +%s) + TIMEOUT ))
while [ "$(date +%s)" -lt "$deadline" ]; do
  state=$(curl -fsS "$api/tasks/$task_id" | python3 -c 'import json,sys; print(json.load(sys.stdin)["processState"])')
  echo "  $task_id: $state"
  case "$state" in
    Processed) echo "smoke test passed"; exit 0 ;;
    Error|Compensated|CompensationFailed) echo "the task ended $state" >&2; exit 1 ;;
  esac
  sleep 3
done
echo "the task did not finish within ${TIMEOUT}s" >&2
exit 1
