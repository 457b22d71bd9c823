"""attnviz: every attention head of real pretrained models, computed by our own modules."""
from .api import Model, ModelInfo, Trace
from .loading import DEFAULT_MODEL, from_hf, list_models, load_model


def open_image(data: bytes):
    """Bytes of an uploaded file -> RGB PIL.Image, or ValueError saying why not."""
    from .imageio import open_image as _open
    return _open(data)


__all__ = ["Model", "ModelInfo", "Trace", "DEFAULT_MODEL", "from_hf", "list_models", "load_model",
           "open_image"]
