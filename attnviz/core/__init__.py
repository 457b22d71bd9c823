"""Layer 2, core: the models. The config, attention, positional encodings, the blocks and the one
block runner every model runs through (blocks, decoder_blocks), the transformer, the one model base
(base_model: `BaseModel`, `ModelInfo`), `Model` / `Trace`, pixels (an image -> the model's input
tensor), tokens, surgery; encoder-decoders (seq2seq, translate, decoding) and speech (whisper,
speech). Decoding what users upload is the layer below (attnviz.uploads).

Imports: torch, PIL (resizing to the model's input), scipy's median filter (where Whisper's word
timings are first computed); attnviz.base, attnviz.uploads.
"""
