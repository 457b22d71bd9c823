"""Layer 4, weights: the catalogue of bundled models, local folders, the safetensors cache, readers
(GGUF, ONNX) and the converters, one per family.

Imports: transformers, gguf, onnx (lazily); attnviz.base, core, toys (the catalogue lists and loads toys).
"""
