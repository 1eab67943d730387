"""LMI-Dist: lmforge's continuous-batching engine on PyTorch + transformers (CPU and GPU).

Heavy imports (torch, transformers) happen only when the engine starts.
"""
