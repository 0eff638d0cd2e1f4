"""SINGA layers: the contract (``base``) and the built-in layer types, registered by name."""
from .base import (AutogradLayer, Blob, Layer, LAYER_TYPES, Param,
                                         layer_class, register_layer)

# Imported on the first lookup of an unknown type name, so `import workloads.singa` stays light.
BUILTIN_MODULES = (
    "workloads.singa.layers.neuron",
    "workloads.singa.layers.conv",
    "workloads.singa.layers.loss",
    "workloads.singa.layers.rbm",
    "workloads.singa.layers.connection",
)

__all__ = ["AutogradLayer", "Blob", "Layer", "LAYER_TYPES", "Param", "layer_class", "register_layer",
           "BUILTIN_MODULES"]
