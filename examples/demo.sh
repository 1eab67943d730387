#!/usr/bin/env bash
# `make demo`: build the tiny example model, serve it, stream a completion, stop.
set -euo pipefail
PY=${PY:-.venv/bin/python}
DEMO_DIR=${DEMO_DIR:-.demo}
PORT=${PORT:-8080}
LMFORGE="$PY -m lmforge"
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}

step() { printf '\n\033[1m==> %s\033[0m\n' "$*"; }

step "1/4 Writing the tiny example model to $DEMO_DIR/model (random weights, local tokenizer)"
$LMFORGE example-model "$DEMO_DIR/model" --overwrite

step "2/4 Starting: lmforge serve $DEMO_DIR/model --port $PORT"
$LMFORGE serve "$DEMO_DIR/model" --port "$PORT" > "$DEMO_DIR/server.log" 2>&1 &
SERVER=$!
trap 'kill $SERVER 2>/dev/null || true; wait $SERVER 2>/dev/null || true' EXIT
for i in $(seq 1 600); do
  code=$(curl -s -o /dev/null -w '%{http_code}' "localhost:$PORT/ping" || true)
  [ "$code" = "200" ] && break
  if ! kill -0 $SERVER 2>/dev/null; then echo "server exited:"; cat "$DEMO_DIR/server.log"; exit 1; fi
  sleep 0.2
done
[ "$code" = "200" ] || { echo "server did not become healthy"; cat "$DEMO_DIR/server.log"; exit 1; }
echo "GET /ping -> 200 (model loaded)"

step "3/4 Streaming a completion (jsonlines, one line per token)"
curl -sN "localhost:$PORT/invocations" -H 'Content-Type: application/json' \
  -d '{"inputs":"def ","parameters":{"max_new_tokens":16,"details":true},"stream":true}'

step "4/4 A chat request (OpenAI schema)"
curl -s "localhost:$PORT/invocations" -H 'Content-Type: application/json' \
  -d '{"messages":[{"role":"user","content":"Write a function"}],"max_tokens":12,"temperature":0}'
echo

step "Done. The text is gibberish: the example model has random weights."
cat <<NEXT
Next (the CLI is .venv/bin/lmforge; 'source .venv/bin/activate' puts it on PATH):
  lmforge serve $DEMO_DIR/model            # serve it yourself on :8080
  lmforge config show $DEMO_DIR/model      # see every setting and where it came from
  Point serving.properties at your own model: option.model_id=/path/to/hf-folder
NEXT
