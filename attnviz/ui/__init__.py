"""Layer 7, ui: the only importer of streamlit: the model picker, shared widgets, one view module per page.

Imports: streamlit; every layer below.
"""
