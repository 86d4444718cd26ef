"""autohet_ray: asymmetric 3D-parallel training on heterogeneous GPU clusters, on Ray."""

__version__ = "0.1.0"


class ConfigError(ValueError):
    """A user-supplied value is invalid; the message names the value and what would be valid."""
