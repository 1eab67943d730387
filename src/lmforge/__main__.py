from lmforge.cli import run

run()
