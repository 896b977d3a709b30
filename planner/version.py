"""The package version, on its own so that every stage can name it without importing the
API façade (`planner/__init__.py`)."""

__version__ = "0.1.0"
