"""Images: what each head of a vision transformer looks at in a photo."""
import streamlit as st

from attnviz.ui import images

st.set_page_config(page_title="attnviz · Images", layout="wide")
st.title("Images — what each head looks at")
images.page()
