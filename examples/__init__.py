"""Examples of tuning your own code, installed as ``prefect_hyperband.examples`` (runnable as files too)."""
