"""The package version, in the core and away from the Jupyter entry points (see ``__init__``)."""

__version__ = "0.1.0"
