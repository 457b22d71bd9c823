"""Layer 1, core: the config, attention, positional encodings, the transformer and its block runner,
`Model` / `Trace`, tokens, images, surgery.

Imports: torch (and PIL for decoding images); attnviz.base.
"""
