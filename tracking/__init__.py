"""The MLflow room: every module that imports MLflow (its store and runs, datasets, model flavours, the champion's
registry calls, its client's waits). Imports no Prefect."""
