#!/bin/sh
# lmforge tensorrt-llm-1.2 container entrypoint (rendered from templates/entrypoint.sh.j2; do not edit).
# SageMaker starts the container as `docker run IMAGE serve`: that, or no argument, serves the model
# in /opt/ml/model (or $LMFORGE_MODEL_DIR) on $SAGEMAKER_BIND_TO_PORT or 8080. Any other command
# runs as given (e.g. `docker run IMAGE lmforge config show /opt/ml/model`).
set -eu
if [ "$#" -eq 0 ] || [ "$1" = "serve" ]; then
  [ "$#" -gt 0 ] && shift
  # exec: the server becomes this process and receives SIGTERM itself
  exec python -m lmforge.container.entrypoint serve "$@"
fi
exec "$@"
