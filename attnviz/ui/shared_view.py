"""Views you can share: a page's whole state in its link, a "Copy link" box and a saved-view file.

    st.selectbox("Layer", **shared_view.linked(key("layer"), options=range(L)))   # a choice in the link
    shared_view.keep_text(key("text"), text, DEFAULT_TEXT)                # a plain text value
    shared_view.share_bar(PAGE)                                            # last, on every page

A linked widget is bound to the URL by Streamlit itself (bind="query-params": its key is the
parameter's name, a value at its default is left out, a value that does not fit the widget's
options is dropped) and kept for the session (persist_state="session"). The head mask travels
as `?heads=` (the head editor's `link`). So the page's link, read on the server at the end of a
run, is the view: opening it in a fresh browser seeds every widget from it.

A text too long for a link (over kept_inputs.LINK_CHARS characters) is left out of it, with a
message; the saved file holds everything, the full text too. The file is JSON (schema version,
page, state); opening one checks it and sets the page's session state, so the widgets show it on
the next run. A widget's value waits until the widget is drawn (another view of the page may draw
it later); then it is checked against what that widget accepts (its options, its bounds and number
kind, its longest text, true/false), as the link's values are by Streamlit, and one that does not
fit is left out with a note, the rest of the file kept. Nothing in a file is executed or unpickled.
"""
from __future__ import annotations

import json
import math
from urllib.parse import urlencode, urlsplit, urlunsplit

import streamlit as st

from attnviz.base.limits import LIMITS
from attnviz.ui import kept_inputs

SCHEMA = 1
APP = "attnviz view"
MASK = "heads"                          # the head editor's link parameter
MODEL_PREFIX = "model_choice:"          # the sidebar pickers' keys (common.MODEL_KEY + tasks)
PENDING = "shared_view.pending"         # values from a file whose widget has not been drawn yet
NOTE = "shared_view.note"               # what the last opened file did: (kind, message)
FORMATS = "shared_view.formats"         # per session: a linked widget's key -> its option labels
FILE_BYTES = 4 * LIMITS.max_text_chars + 2**16   # a file with every text at its longest fits
# Keys linked since the server started: names the code makes (a page's namespace + a widget),
# so the set is bounded by the code, not by what users send.
_LINKED: dict[str, None] = {}
_TEXTS: dict[str, None] = {}             # of those, the plain texts (keep_text, saved): not widgets


def linked(key: str, chars: int | None = None, format_func=None, *, options=None, bounds=None,
           kind=None) -> dict:
    """Keyword arguments of a widget whose value is part of the shared view (replaces key=...),
    with what the widget accepts, which a value from an opened file must fit (`fits`):
    `options`: a selectbox's, radio's, select_slider's or segmented control's (with kind=list, a
    multiselect's); `bounds=(lo, hi)`: a slider's or number_input's (int or float as the bounds
    are, unless `kind` says); `kind=bool`: a toggle's; `chars` or kind=str: a text's, `chars` its
    longest value (a text in the link is at most kept_inputs.LINK_CHARS).
    `format_func`: the widget's own (the link names an option by its label, as Streamlit does).
    The widget takes its options (options=) and bounds (min_value=, max_value=) from here, so the
    check and the widget cannot differ. A value from an opened file for this widget is checked
    and set just before it is drawn; one that does not fit is left out, with a note."""
    if chars is not None:
        chars = min(chars, kept_inputs.LINK_CHARS)
        kind = kind or str
    if options is not None:
        options = list(options)
    if options is None and bounds is None and kind is None:
        raise TypeError(f"linked({key!r}) needs what its widget accepts: options, bounds, kind or chars")
    _LINKED[key] = None
    ss = st.session_state
    pending = ss.get(PENDING)
    if pending and key in pending:
        value, why = fits(pending.pop(key), options=options, bounds=bounds, kind=kind, chars=chars)
        if why is None:
            ss[key] = value
        else:
            left_out(key, value, why)
    ss.setdefault(FORMATS, {})[key] = format_func or str
    return dict(key=key, bind="query-params", persist_state="session",
                **({} if chars is None else dict(max_chars=chars)),
                **({} if options is None else dict(options=options)),
                **({} if bounds is None else dict(min_value=bounds[0], max_value=bounds[1])),
                **({} if format_func is None else dict(format_func=format_func)))


# ---------------------------------------------------------------- what a widget accepts
def _option(value, options: list):
    """The index of `value` among `options` (a bool matches only a bool: True == 1 in Python), or None."""
    for i, option in enumerate(options):
        try:
            if isinstance(option, bool) == isinstance(value, bool) and bool(option == value):
                return i
        except (TypeError, ValueError):     # an option that does not compare with a plain value
            continue
    return None


def _short(value) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def fits(value, *, options=None, bounds=None, kind=None, chars=None) -> tuple[object, str | None]:
    """(the value as the widget takes it, None) when `value` fits a widget that accepts these (as
    `linked` takes them), else (value, why not). The one check of a saved view's values: a link's
    go through Streamlit's own, which drops what its widget would refuse."""
    if options is not None:
        choices = value if kind is list else [value]
        if kind is list and not isinstance(value, list):
            return value, "it is not a list of choices"
        found = [_option(v, options) for v in choices]
        for v, i in zip(choices, found):
            if i is None:
                return value, f"{_short(v)} is not one of its {len(options)} choices"
        if len(set(found)) < len(found):
            return value, "it names a choice twice"
        picked = [options[i] for i in found]
        return (picked if kind is list else picked[0]), None
    if isinstance(value, bool) != (kind is bool):
        return value, "it is true/false" if isinstance(value, bool) else "it is not true/false"
    if kind is bool:
        return value, None
    if bounds is not None:
        lo, hi = bounds
        whole = kind is int or (kind is None and not isinstance(lo, float) and not isinstance(hi, float))
        if whole and not isinstance(value, int):
            return value, "it is not a whole number"
        if not isinstance(value, (int, float)):
            return value, "it is not a number"
        if not lo <= value <= hi:
            return value, f"it is outside {lo:g} to {hi:g}"
        return (value if whole else float(value)), None
    if kind is str:
        if not isinstance(value, str):
            return value, "it is not text"
        if chars is not None and len(value) > chars:
            return value, f"it is {len(value):,} characters; this box takes at most {chars:,}"
        return value, None
    raise TypeError(f"nothing to check {_short(value)} against: give options, bounds, kind or chars")


def left_out(key: str, value, why: str):
    """Say that a value from an opened file was left out: with the file's note when the file was
    opened in this run (the sidebar shows it at the end of the run), else as a toast."""
    message = f"Left out {key} = {_short(value)}: {why}; it keeps the value it had."
    ss = st.session_state
    if NOTE in ss:
        kind, text = ss[NOTE]
        ss[NOTE] = ("error" if kind == "error" else "warning", f"{text} {message}")
    else:
        st.toast(message, icon=":material/warning:")


def namespace(key: str) -> str:
    return key.split(".", 1)[0] if "." in key else ""


# ---------------------------------------------------------------- plain values (not widgets)
def saved(key: str):
    """Keep `key` (a widget's or a plain value's) in the saved file, not in the link: a text box
    in a form, whose committed text the link carries under another key."""
    _LINKED[key] = _TEXTS[key] = None


def first_visit(key: str) -> bool:
    """True on the first run of a session that reads `key` from the link (once per session: later
    runs keep what the user made of it)."""
    read = f"{key}:link_read"
    first = not st.session_state.get(read)
    st.session_state[read] = True
    return first


def seed_text(key: str) -> str | None:
    """A text kept in the link under `key`, read on the session's first visit; else None."""
    return st.query_params.get(key) if first_visit(key) else None


def keep_text(key: str, text: str, default: str = "", chars: int = kept_inputs.LINK_CHARS) -> bool:
    """Put `text` in the page's link under `key` (left out at its default). A text longer than
    `chars` is left out of the link, with a message to share it as a saved view instead.
    Returns whether the link carries it."""
    _LINKED[key] = _TEXTS[key] = None
    # the link is written only when it changes: each write sends the whole query string, which
    # would undo a linked widget's value that the browser has put in the URL since the run began
    if text == default or len(text) > chars:
        if key in st.query_params:
            del st.query_params[key]
        if len(text) > chars:
            st.caption(f"This text is {len(text):,} characters, too long for a link (at most {chars:,}): "
                       "the link leaves it out. Use **Save view** in the sidebar to share it.")
        return text == default
    if st.query_params.get(key) != text:
        st.query_params[key] = text
    return True


# ---------------------------------------------------------------- the link
def link(base: str | None, params: dict[str, list[str]]) -> str:
    """The page's address (`base`, its query string dropped) with `params` as its query."""
    parts = urlsplit(base or "")
    query = urlencode({k: v for k, v in params.items() if v not in ([], "")}, doseq=True)
    return urlunsplit((parts.scheme, parts.netloc, parts.path, query, ""))


def url_value(value, label=str) -> list[str]:
    """A widget value as Streamlit reads it from a link: an option's label, true / false, a list
    as repeated parameters, nothing for None."""
    if isinstance(value, (list, tuple)):
        return [label(v) for v in value]
    if isinstance(value, bool):
        return ["true" if value else "false"]
    return [] if value is None else [label(value)]


def link_params(page: str, state, params: dict[str, list[str]]) -> dict[str, list[str]]:
    """The link's query: what the page wrote in it (the head mask, a text) and, written from the
    session, every linked widget of the page drawn in this session. The server's copy of the
    browser's query string can lag a widget change, so the session's values are what count."""
    labels = state.get(FORMATS, {})
    out = dict(params)
    for k, label in labels.items():
        if (namespace(k) == page or k.startswith(MODEL_PREFIX)) and k in state and is_plain(state[k]):
            try:
                out[k] = url_value(state[k], label)
            except (IndexError, KeyError, TypeError, ValueError):   # labels of another run's options
                out.pop(k, None)
    return out


def current_link(page: str) -> str:
    params = {k: st.query_params.get_all(k) for k in st.query_params}
    return link(st.context.url, link_params(page, st.session_state, params))


# ---------------------------------------------------------------- the saved file
def is_plain(value) -> bool:
    """A value a file may carry: a string, a finite number, a bool, None, or a list of those."""
    if isinstance(value, list):
        return all(is_plain(v) and not isinstance(v, list) for v in value)
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, str):      # a lone surrogate (a JSON "\ud800") is no character: no widget takes it
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return False
    return value is None or isinstance(value, (str, int, bool))


def page_state(page: str, state, params: dict[str, str]) -> dict:
    """The page's shareable state: its linked keys (widgets and texts) in `state` whose values
    are plain, the sidebar's model choice, and the head mask from the link."""
    keys = [k for k in list(_LINKED) + [k for k in params if namespace(k) == page]
            if (namespace(k) == page or k.startswith(MODEL_PREFIX)) and k in state]
    out = {k: state[k] for k in dict.fromkeys(keys) if is_plain(state[k])}
    out = {k: list(v) if isinstance(v, tuple) else v for k, v in out.items()}
    if params.get(MASK):
        out[MASK] = params[MASK]
    return dict(sorted(out.items()))


def view_file(page: str, state: dict) -> bytes:
    return json.dumps(dict(app=APP, schema=SCHEMA, page=page, state=state), ensure_ascii=False,
                      indent=1).encode("utf-8")


def read_view_file(data: bytes, page: str) -> tuple[dict, list[str]]:
    """(state, ignored keys) of a saved view of `page`; a ValueError that says what is wrong for
    anything that is not one (not JSON, another page, a newer schema, wrong types)."""
    if len(data) > FILE_BYTES:
        raise ValueError(f"This file is {len(data):,} bytes; a saved view is at most {FILE_BYTES:,}.")
    try:
        doc = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ValueError(f"This is not a saved view: it is not JSON text ({err}).") from None
    except RecursionError:
        raise ValueError("This is not a saved view: its JSON is nested far deeper than a view's.") from None
    except ValueError as err:   # e.g. an integer of more digits than Python converts
        raise ValueError(f"This is not a saved view: it holds {str(err)[:80]}.") from None
    if not isinstance(doc, dict) or doc.get("app") != APP:
        raise ValueError("This is not a saved view of attnviz (it has no \"app\": \"attnviz view\").")
    schema = doc.get("schema")
    if not isinstance(schema, int) or isinstance(schema, bool) or not 1 <= schema <= SCHEMA:
        raise ValueError(f"This saved view has schema {schema!r}; this app reads schema 1 to {SCHEMA}.")
    if doc.get("page") != page:
        raise ValueError(f"This is a saved view of the {str(doc.get('page')).title()!r} page; "
                         f"open it there (this is the {page.title()} page).")
    state = doc.get("state")
    if not isinstance(state, dict):
        raise ValueError("This saved view's \"state\" is not a table of names and values.")
    kept, ignored = {}, []
    for k, v in state.items():
        if not (namespace(k) == page or k.startswith(MODEL_PREFIX) or k == MASK):
            ignored.append(k)
        elif not is_plain(v) or (k == MASK and not isinstance(v, str)):
            raise ValueError(f"This saved view's {k!r} is {type(v).__name__} {str(v)[:60]!r}: "
                             "a saved value is text, a number, true/false or a list of those.")
        elif isinstance(v, str) and len(v) > LIMITS.max_text_chars:
            raise ValueError(f"This saved view's {k!r} is {len(v):,} characters; at most "
                             f"{LIMITS.max_text_chars:,}.")
        else:
            kept[k] = v
    return kept, ignored


def restore(page: str, state: dict, ss, params) -> list[tuple[str, object, str]]:
    """Set a checked saved view's `state` in the session `ss` and the link `params`: a widget's
    value waits in PENDING, checked against the widget when it is drawn (`linked`). Returns the
    (key, value, why) of the values left out now."""
    pending = ss.setdefault(PENDING, {})
    out = []
    for k, v in state.items():
        if k == MASK:
            params[MASK] = v
            ss.pop(f"{page}.link_read", None)      # the head editor reads the link again
        elif k in _TEXTS:
            value, why = fits(v, kind=str)
            if why is None:
                ss[k] = value
            else:
                out.append((k, v, why))
        else:
            pending[k] = v  # never set here: a widget's own options and bounds are known only as it is drawn
    return out


def open_view(page: str, uploader_key: str):
    """The uploader's callback (it runs before the page): check the file, then set the state."""
    ss = st.session_state
    uploaded = ss.get(uploader_key)
    if uploaded is None:
        return
    try:
        state, ignored = read_view_file(uploaded.getvalue(), page)
    except ValueError as err:
        ss[NOTE] = ("error", f"{uploaded.name}: {err} Nothing was changed.")
        return
    dropped = restore(page, state, ss, st.query_params)
    message = f"Opened {uploaded.name}: {len(state)} value(s) read."
    if ignored:
        message += f" Ignored {len(ignored)} name(s) this page does not have: {', '.join(ignored[:8])}."
    ss[NOTE] = ("warning" if ignored else "success", message)
    for k, v, why in dropped:
        left_out(k, v, why)


def share_bar(page: str):
    """The sidebar's "Share this view": the link (with a copy button), Save view, Open a view.
    Drawn last, so the link has every value this run set."""
    ss = st.session_state
    params = {k: st.query_params[k] for k in st.query_params}
    # Opening the box reruns the page: a part of the page that reruns alone (the head editor's
    # Apply, the views beside it) does not redraw the sidebar, so the link is made afresh then.
    box = st.sidebar.expander("Share this view", icon=":material/share:", key="shared_view.open",
                              on_change="rerun")
    if not box.open:        # closed: nothing is built, and no second uploader waits in the sidebar
        return
    with box:
        st.caption("Copy link (the button at the box's right), or save the view as a file.")
        st.code(current_link(page), language=None, wrap_lines=True)
        st.button("Refresh the link", key=f"{page}.share_refresh", icon=":material/refresh:",
                  help="after a change beside the head editor, which reruns only that part of the page")
        state = page_state(page, ss, params)
        st.download_button("Save view", view_file(page, state), file_name=f"attnviz-{page}-view.json",
                           mime="application/json", key=f"{page}.share_save", on_click="ignore",
                           icon=":material/download:")
        uploader = f"{page}.share_open"
        st.file_uploader("Open a saved view", type=["json"], key=uploader, on_change=open_view,
                         args=(page, uploader), help="a file saved with Save view on this page")
        if NOTE in ss:
            kind, message = ss.pop(NOTE)
            getattr(st, kind)(message)
