"""The bundled ``prefect.yaml``: the example deployments, for ``prefect deploy --prefect-file``."""
