"""Prefect flows: the tuning job and its brackets. They wire tasks together and hold no algorithm."""
