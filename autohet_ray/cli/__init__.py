"""The `autohet` command (argparse and console output only): `main` parses and dispatches to one module per
command. Bad input gets one line naming the value and what is valid, exit code 2."""
from autohet_ray.cli.main import main

__all__ = ["main"]
