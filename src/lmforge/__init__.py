"""lmforge: build, run and deploy LLM serving containers in the style of AWS LMI."""

__version__ = "0.1.0"
