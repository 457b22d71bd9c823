"""Layer 3, toys: synthetic tasks with exact answers, scoring, shipped toy checkpoints, training.

Imports: attnviz.base, attnviz.core.
"""
