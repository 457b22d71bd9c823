"""attnviz: every attention head of real pretrained models, computed by our own modules.

The library is layered; each subpackage imports only from those above it here:
base -> uploads -> core -> toys -> weights -> analysis, latency -> figures -> ui (the only streamlit
importer).

Every loaded model is a `BaseModel`: a `Model` (decoder, encoder or vision; `trace` -> `Trace`),
a `Seq2SeqModel` (translation; `translate` / `trace` -> `Translation`) or a `SpeechModel`
(`transcribe` / `trace` -> `Transcript`).
"""
from attnviz.core.base_model import BaseModel, ModelInfo
from attnviz.core.model import Model, Trace
from attnviz.core.speech_model import SpeechModel, Transcript
from attnviz.core.translator import Seq2SeqModel
from attnviz.core.translation_parts import Translation
from attnviz.uploads.images import open_image
from attnviz.weights.catalogue import DEFAULT_MODEL, from_hf, list_models, load_model


__all__ = ["BaseModel", "Model", "Seq2SeqModel", "SpeechModel", "ModelInfo", "Trace", "Translation",
           "Transcript", "DEFAULT_MODEL", "from_hf", "list_models", "load_model", "open_image"]
