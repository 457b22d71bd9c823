"""Layer 2, core: the models. The config, attention, positional encodings, the transformer and its
block runner, the one model base (base_model: `BaseModel`, `ModelInfo`), `Model` / `Trace`, pixels
(an image -> the model's input tensor), tokens, surgery; encoder-decoders (seq2seq, translate) and
speech (whisper, speech). Decoding what users upload is the layer below (attnviz.uploads).

Imports: torch, PIL (resizing to the model's input), scipy's median filter (where Whisper's word
timings are first computed); attnviz.base, attnviz.uploads.
"""
