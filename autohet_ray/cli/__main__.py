"""`python -m autohet_ray.cli`: the `autohet` command."""
import sys

from autohet_ray.cli.main import main

sys.exit(main())
