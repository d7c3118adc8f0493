"""Prefect tasks: thin wrappers over the plain code in ``hyperband`` and ``trainers``, and the MLflow I/O."""
