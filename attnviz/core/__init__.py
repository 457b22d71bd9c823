"""Layer 1, core: the config, attention, positional encodings, the transformer and its block runner,
the one model base (base_model: `BaseModel`, `ModelInfo`), `Model` / `Trace`, tokens, images,
surgery; encoder-decoders (seq2seq, translate) and speech (whisper, speech, audio).

Imports: torch (and PIL for decoding images; soundfile, scipy and transformers' Whisper feature
extractor for audio); attnviz.base.
"""
