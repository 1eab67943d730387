"""vLLM backend (imports vLLM only when an engine starts)."""
