"""`python -m trainops ...`: the CLI, for a subprocess that has the interpreter but not the script."""
from trainops.cli import main

main()
