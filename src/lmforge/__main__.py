from lmforge.cli import main

main()
