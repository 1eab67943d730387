"""TensorRT-LLM backend: build plan, JIT/AOT compilation, and the engine (imports TensorRT-LLM lazily)."""
