"""The built-in models, one file each, each defining ``MODEL = registry.Model(...)``."""
