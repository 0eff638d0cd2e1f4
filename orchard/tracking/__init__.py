"""Tracking: everything a run records and how (MLflow).

    mlflow_run.py      the MLflow run: experiment, tags, params, config artifact, dataset; open and close
    store.py           the MLflow store: its check before a run, retried writes, the UI's address
    context.py         RunContext: what workload code on any Ray worker logs through; the run's storage
    sink.py            one Ray actor per run that batches every worker's metrics into MLflow
    system_metrics.py  CPU/RAM/GPU sampling on every node of a run (system/* metrics)
    process_cpu.py     CPU time of one process tree, counted so no process leaves the sum
    lost_runs.py       heartbeat while a run lives; the reaper of runs whose driver died
    datasets.py        a training run's data as its MLflow dataset input

Nothing is imported here: ``import orchard.tracking.store`` runs only what it names.
"""
