"""Heads: switch heads off and watch the outputs change; rank heads; pruning curves; real pruning."""
import streamlit as st

from attnviz.ui import heads

st.set_page_config(page_title="Heads · attnviz", layout="wide")
st.title("Heads — switch heads off, rank them, prune for real")
heads.page()
