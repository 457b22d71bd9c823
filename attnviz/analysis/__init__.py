"""Layer 5, analysis: head statistics and roles, long captures, effects of masks, importance, pruning
curves, head scores, vision analysis, lab computations.

Imports: attnviz.base, uploads, core, toys, weights.
"""
