"""hpcwatch: an AI training cluster as it runs and as it can be attacked."""

__all__ = ["__version__"]

__version__ = "0.1.0"
