#!/usr/bin/env bash
# `make demo-image`: lmforge's own image, end to end on this machine, with no AWS account and no public
# registry: base image -> build -> local SageMaker in image mode -> push to the local ECR -> deploy with
# the SageMaker SDK v2 (Model(image_uri=<ECR URI>)) -> stream with boto3 -> delete -> tear down.
# Every instance of the endpoint is the pushed image, run by podman or docker.
set -euo pipefail
DEMO_DIR=${DEMO_DIR:-.demo-image}
ENDPOINT=${ENDPOINT:-lmforge-image-demo}
INSTANCE_TYPE=${INSTANCE_TYPE:-ml.m5.xlarge}
FLAVOUR=${FLAVOUR:-cpu}
. "$(dirname "$0")/demo_common.sh"

step "1/7 Tiny example model in $DEMO_DIR/model"
$LMFORGE example-model "$DEMO_DIR/model" --overwrite

step "2/7 Base image (Debian bookworm + Python 3.11 from Debian packages: no public registry needed)"
$LMFORGE container base

step "3/7 lmforge container build $FLAVOUR"
$LMFORGE container build "$FLAVOUR"

step "4/7 Local SageMaker in image mode: S3, SageMaker, ECR with a real registry, runtime"
$LMFORGE local up --mode image
eval "$($LMFORGE local up --print-env)"
trap teardown EXIT

step "5/7 lmforge container push $FLAVOUR (create repository, get-authorization-token, login, push)"
IMAGE_URI=$($LMFORGE container push "$FLAVOUR")
echo "image: $IMAGE_URI"
aws_images=$($PY - "$FLAVOUR" <<'PYEOF'
import sys, boto3
repo = f"lmforge-{sys.argv[1]}"
for d in boto3.client("ecr").describe_images(repositoryName=repo)["imageDetails"]:
    print(f"    ECR {repo}: tags {d.get('imageTags')} digest {d['imageDigest'][:19]}... {d['imageSizeInBytes'] / 1e6:.0f} MB")
PYEOF
)
echo "$aws_images"

step "6/7 SageMaker SDK v2: Model(image_uri=$IMAGE_URI).deploy(), predict_stream (examples/sagemaker_sdk_v2.py)"
$PY examples/sagemaker_sdk_v2.py "$DEMO_DIR/model" --endpoint-name "$ENDPOINT" \
  --instance-type "$INSTANCE_TYPE" --image-uri "$IMAGE_URI" --keep
$LMFORGE local status | sed 's/^/    /'

step "7/7 boto3 invoke_endpoint_with_response_stream (examples/stream_boto3.py), served from inside the image"
$PY examples/stream_boto3.py "$ENDPOINT" "def fibonacci(n):"

step "Done: the endpoint ran lmforge's $FLAVOUR image, pulled from the local ECR. (Random weights: gibberish text.)"
cat <<NEXT
Next:
  lmforge container push $FLAVOUR --region REGION     # the same push to your AWS account's ECR
  lmforge deploy $DEMO_DIR/model --endpoint-name my-llm --instance-type ml.m5.xlarge   # uses that image
  podman run --rm -p 8080:8080 -v \$PWD/$DEMO_DIR/model:/opt/ml/model:ro lmforge/$FLAVOUR:\$(lmforge --version | cut -d' ' -f3) 
NEXT
