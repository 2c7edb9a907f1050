"""batchrun's version (the package's `__version__`), apart from the package's `__init__`, so
that the core can read it without importing the Python API the package exports."""

__version__ = "0.1.0"
