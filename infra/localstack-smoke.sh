#!/usr/bin/env bash
# Submits one order through the LocalStack API Gateway URL of a stack deployed by
# infra/localstack-deploy.sh and polls it until it is Processed (or fails after a timeout).
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

answer=$(curl -fsS -X POST "$api/orders" \
  -H 'Content-Type: application/json' \
  -H "Idempotency-Key: smoke-$(date +%s)" \
  -d '{"customerId":"c-smoke","items":[{"sku":"SKU-1","quantity":1}]}')
echo "POST /orders -> $answer"
order_id=$(python3 -c 'import json,sys; print(json.load(sys.stdin)["orderId"])' <<<"$answer")

deadline=$(( $(date +%s) + TIMEOUT ))
while [ "$(date +%s)" -lt "$deadline" ]; do
  state=$(curl -fsS "$api/orders/$order_id" | python3 -c 'import json,sys; print(json.load(sys.stdin)["processState"])')
  echo "  $order_id: $state"
  case "$state" in
    Processed) echo "smoke test passed"; exit 0 ;;
    Error) echo "the order failed" >&2; exit 1 ;;
  esac
  sleep 3
done
echo "the order did not finish within ${TIMEOUT}s" >&2
exit 1
