"""Plain-Python trainers: ``train(config, resource, checkpoint) -> result``; no Prefect or MLflow here."""
