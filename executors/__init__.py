"""Where a trial-rung runs, apart from what it trains: the loop and its protocol (``loop``), this process's threads
(``threads``, ``runner``), torch's warm local pools (``torch_pool``) and a Dask cluster's groups of workers
(``dask_groups``, ``dask_ranks``, ``dask_function``, ``dask_script``)."""
