"""Layer 4, weights: the catalogue of bundled models, local folders, the safetensors cache, readers
(GGUF, ONNX), and `families/`: one file per family, its converter and any reader only it uses
(Marian `.bin`, CTranslate2), registered in the one registry, `families.FAMILIES`.

Imports: transformers, gguf, onnx (lazily); attnviz.base, core, toys (the catalogue lists and loads toys).
"""
