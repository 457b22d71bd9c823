"""attnviz: every attention head of real pretrained models, computed by our own modules.

The library is layered; each subpackage imports only from those above it here:
base -> uploads -> core -> toys -> weights -> analysis, latency -> figures -> ui (the only streamlit
importer).
"""
from attnviz.core.model import Model, ModelInfo, Trace
from attnviz.uploads.images import open_image
from attnviz.weights.catalogue import DEFAULT_MODEL, from_hf, list_models, load_model


__all__ = ["Model", "ModelInfo", "Trace", "DEFAULT_MODEL", "from_hf", "list_models", "load_model",
           "open_image"]
