"""FAKE NVIDIA ModelOpt (tests only): the names lmforge's quantization child calls, with the parameters
recorded from Model-Optimizer 0.46.0 in tests/fakes/modelopt_api.json. ``quantize`` runs the real
calibration loop (forward passes through the real transformers model) and remembers the recipe;
``export_hf_checkpoint`` saves the model as it is with the ``hf_quant_config.json`` / ``quantization_config``
that a ModelOpt export writes, so TensorRT-LLM's loader (the fake one) sees a quantized checkpoint.

Knobs (environment): FAKE_MODELOPT_COUNT=PATH appends one line per quantization; FAKE_MODELOPT_SECONDS=N
makes it take N seconds longer; FAKE_MODELOPT_FAIL=1 makes it fail after a log line.
"""

__version__ = "0.46.0"
