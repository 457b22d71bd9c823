"""Typed inputs that survive: a view switch, another page and back, a reload, a shared link.

    st.text_area("Prompt", key=key("text"), **kept_inputs.kept())

Streamlit drops a widget's value on every run that does not draw it (another view, another
page), and a reload starts a new session. A kept input is stored for the session
(persist_state="session") and in the page's own URL under its key (bind="query-params"), the way
the head mask travels in `?heads=`. The URL is the browser tab's own, so nothing is shared
between sessions, and the text is bounded so a link stays short.
"""
from __future__ import annotations

# A typed text kept in the page's link is at most this long, so links stay far below what
# browsers and the server accept in a URL.
LINK_CHARS = 2000
LINK_HELP = (f"At most {LINK_CHARS:,} characters: the text is kept in this page's link, so a reload "
             "or a shared link brings it back.")


def kept(chars: int = LINK_CHARS) -> dict:
    """Keyword arguments of a keyed text input kept for the session and in the page's link, at
    most `chars` characters."""
    return dict(persist_state="session", bind="query-params", max_chars=chars)

