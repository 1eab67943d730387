"""FAKE TensorRT-LLM (tests only): the few names lmforge's TensorRT-LLM backend calls, with the same
signatures as the pinned release (checked against tests/fakes/trtllm_api.json, recorded from its
source). It "builds" an engine folder with the real layout (config.json with pretrained_config and
build_config, rank0.engine) and "generates" deterministic token ids, so lmforge's control flow (plan,
JIT/AOT compile, cache, streaming, abort, finish reasons) runs without a GPU.

Knobs (environment): FAKE_TRTLLM_FAIL=1 makes the build fail after printing a log line;
FAKE_TRTLLM_BUILD_SECONDS=N makes it take N seconds; FAKE_TRTLLM_BUILD_COUNT=PATH appends a line
per build to PATH.
"""

__version__ = "1.2.1"
