"""Layer 7, ui: the only importer of streamlit: the model picker, shared widgets, one view module per page.

Imports: streamlit; every layer below.
"""
from attnviz.ui.common import *  # noqa: F401,F403  (pages call ui.model_picker(), ...)
from attnviz.ui import common  # noqa: F401
