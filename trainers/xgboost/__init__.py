"""The built-in XGBoost model: its config, trainer, and ranks on Dask groups."""
