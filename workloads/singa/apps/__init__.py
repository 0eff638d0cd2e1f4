"""Data for the SINGA apps (section 4).  Every loader returns a ``Dataset`` of numpy arrays."""
from workloads.singa.apps.dataset import Dataset, load_dataset, DATASETS

__all__ = ["Dataset", "load_dataset", "DATASETS"]
