"""Layer 1, core: the config, attention, positional encodings, the blocks and the one block runner
every model runs through (blocks, decoder_blocks), the transformer, `Model` / `Trace`, tokens,
images, surgery; encoder-decoders (seq2seq, translate, decoding) and speech (whisper, speech, audio).

Imports: torch (and PIL for decoding images; soundfile, scipy and transformers' Whisper feature
extractor for audio); attnviz.base.
"""
