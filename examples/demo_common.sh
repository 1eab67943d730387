# Shared by examples/demo.sh and examples/demo_image.sh (sourced, after DEMO_DIR and ENDPOINT are set):
# the lmforge command, the local SageMaker's state folder, step headings, and the teardown that
# deletes the endpoint and stops the local SageMaker whatever happened.
PY=${PY:-.venv/bin/python}
LMFORGE="$PY -m lmforge"
export LMFORGE_LOCAL_DIR="$PWD/$DEMO_DIR/local"
export AWS_DEFAULT_REGION=${AWS_DEFAULT_REGION:-us-west-2}

step() { printf '\n\033[1m==> %s\033[0m\n' "$*"; }
teardown() {
  status=$?
  step "Tearing down"
  $LMFORGE delete "$ENDPOINT" 2>&1 | sed 's/^/    /' || true
  $LMFORGE local down || true
  exit $status
}
