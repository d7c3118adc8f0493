"""Bundled data sets, shipped inside the package (read with ``importlib.resources``)."""
