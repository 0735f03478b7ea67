#!/usr/bin/env bash
# Deploys the whole stack (template.yaml) to LocalStack. Needs Docker with LocalStack running
# (`localstack start -d`) and `pip install aws-sam-cli aws-sam-cli-local awscli-local`, plus
# cargo-lambda (`pip install cargo-lambda`) for the build. Cannot run on machines without a
# Docker engine; CI checks this script's syntax only.
set -euo pipefail
cd "$(dirname "$0")/.."

ENDPOINT="${LOCALSTACK_ENDPOINT:-http://localhost:4566}"
STACK="${STACK_NAME:-sas-localstack}"
STAGE="${STAGE:-local}"
export AWS_ACCESS_KEY_ID="${AWS_ACCESS_KEY_ID:-test}" AWS_SECRET_ACCESS_KEY="${AWS_SECRET_ACCESS_KEY:-test}"
export AWS_DEFAULT_REGION="${AWS_DEFAULT_REGION:-us-east-1}" SAM_CLI_TELEMETRY=0

for cmd in samlocal awslocal cargo-lambda; do
  command -v "$cmd" >/dev/null || { echo "missing $cmd: pip install aws-sam-cli aws-sam-cli-local awscli-local cargo-lambda" >&2; exit 1; }
done
curl -fsS "$ENDPOINT/_localstack/health" >/dev/null \
  || { echo "LocalStack does not answer at $ENDPOINT: run \`localstack start -d\` (Docker)" >&2; exit 1; }

samlocal build
samlocal deploy \
  --stack-name "$STACK" \
  --resolve-s3 \
  --capabilities CAPABILITY_IAM \
  --no-confirm-changeset \
  --no-fail-on-empty-changeset \
  --parameter-overrides "Stage=$STAGE" "ApiAuth=None" "StepTimeoutSeconds=30" "PickupTimeoutSeconds=60" "RetryBaseDelaySeconds=1"
awslocal cloudformation describe-stacks --stack-name "$STACK" \
  --query 'Stacks[0].Outputs[].[OutputKey,OutputValue]' --output table
echo "Deployed. Try: STACK_NAME=$STACK infra/localstack-smoke.sh"
