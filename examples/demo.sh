#!/usr/bin/env bash
# `make demo`: the user's main job on the local SageMaker, end to end, with no AWS account:
# tiny example model -> plan -> package -> local SageMaker -> deploy -> stream with real boto3 -> tear down.
set -euo pipefail
DEMO_DIR=${DEMO_DIR:-.demo}
ENDPOINT=${ENDPOINT:-lmforge-demo}
INSTANCE_TYPE=${INSTANCE_TYPE:-ml.m5.xlarge}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
. "$(dirname "$0")/demo_common.sh"

step "1/6 Writing the tiny example model to $DEMO_DIR/model (random weights, local tokenizer)"
$LMFORGE example-model "$DEMO_DIR/model" --overwrite

step "2/6 Planning memory for $INSTANCE_TYPE"
$LMFORGE plan "$DEMO_DIR/model" --instance-type "$INSTANCE_TYPE"

step "3/6 Packaging (deterministic model.tar.gz with a sha256 manifest)"
$LMFORGE package "$DEMO_DIR/model" -o "$DEMO_DIR/model.tar.gz"

step "4/6 Starting the local SageMaker (moto control plane + S3, lmforge runtime) in process mode"
# process mode: lmforge's server runs as a host process, standing in for lmforge's image (seconds, no
# container engine needed); `make demo-image` builds the image and runs that instead
$LMFORGE local up --mode process
eval "$($LMFORGE local up --print-env)"
trap teardown EXIT
echo "boto3 now talks to AWS_ENDPOINT_URL=$AWS_ENDPOINT_URL (runtime: $AWS_ENDPOINT_URL_SAGEMAKER_RUNTIME)"

step "5/6 lmforge deploy $DEMO_DIR/model --endpoint-name $ENDPOINT --instance-type $INSTANCE_TYPE"
$LMFORGE deploy "$DEMO_DIR/model" --endpoint-name "$ENDPOINT" --instance-type "$INSTANCE_TYPE"

step "6/6 Streaming through boto3 invoke_endpoint_with_response_stream (examples/stream_boto3.py)"
$PY examples/stream_boto3.py "$ENDPOINT" "def fibonacci(n):"

step "Done. The text is gibberish: the example model has random weights."
cat <<NEXT
Next (the CLI is .venv/bin/lmforge; 'source .venv/bin/activate' puts it on PATH):
  eval "\$(lmforge local up --print-env)"          # keep a local SageMaker running
  lmforge deploy $DEMO_DIR/model --endpoint-name my-llm --instance-type ml.m5.xlarge
  lmforge invoke my-llm 'def hello():' --stream --details
  python examples/sagemaker_sdk_v2.py $DEMO_DIR/model --endpoint-name sdk-llm   # the SageMaker SDK v2 way
  lmforge serve $DEMO_DIR/model                     # or just the model server, on :8080
  Without the local env vars, the same deploy goes to your AWS account (add --role ARN).
NEXT
