"""Layer 0, base: limits, heavy-job slots, deadlines and cancel, the timer, exports, bundled texts.

Imports: the standard library, numpy, pandas. Nothing else of attnviz.
"""
