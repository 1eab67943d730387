"""Harness shared by the tests and the benchmarks: real ``lmforge serve`` processes on loopback ports
(:mod:`lmforge.testing.server`) and LoRA reference material (:mod:`lmforge.testing.lora`).

Nothing here runs in a serving container; it sits in the package so that ``bench/`` and ``tests/``
import one harness, and neither imports the other.
"""
