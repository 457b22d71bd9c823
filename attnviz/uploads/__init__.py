"""Layer 1, uploads: untrusted image and audio files decoded safely, below the models: images
(checks from the header, bounded server-wide decodes, sample photos), bands (large PNG / TIFF a band
of rows at a time), colour (any Pillow mode to 8-bit RGB in bounded memory), audio (WAV / FLAC to
checked 16 kHz mono samples, and their log-mel).

Imports: numpy, PIL, soundfile, torch (the log-mel tensor; and, where audio is first decoded, scipy
and transformers' Whisper feature extractor); attnviz.base.
"""
