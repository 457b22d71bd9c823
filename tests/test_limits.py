import pytest

import attnviz
from attnviz.base.limits import Limits


def test_env_overrides_and_bad_values(monkeypatch):
    monkeypatch.setenv("ATTNVIZ_MAX_TEXT_CHARS", "1234")
    monkeypatch.setenv("ATTNVIZ_MAX_SWEEP_SECONDS", "2.5")
    lim = Limits.from_env()
    assert lim.max_text_chars == 1234 and lim.max_sweep_seconds == 2.5
    monkeypatch.setenv("ATTNVIZ_MAX_TEXT_CHARS", "lots")
    with pytest.raises(ValueError, match="ATTNVIZ_MAX_TEXT_CHARS"):
        Limits.from_env()


def test_allow_list(tmp_path):
    inside, outside = tmp_path / "models" / "a", tmp_path / "elsewhere"
    inside.mkdir(parents=True), outside.mkdir()
    lim = Limits(allowed_model_dirs=str(tmp_path / "models"))
    assert lim.check_model_dir(inside) == inside.resolve()
    with pytest.raises(ValueError, match="only loads model folders under"):
        lim.check_model_dir(outside)
    with pytest.raises(ValueError, match="only loads"):
        lim.check_model_dir(tmp_path / "models" / ".." / "elsewhere")
    assert Limits().check_model_dir(outside) == outside.resolve()  # default: any folder


def test_allow_list_applies_to_load_model(tmp_path, monkeypatch, set_limits):
    from attnviz.weights import catalogue
    set_limits(allowed_model_dirs=str(tmp_path / "ok"))
    with pytest.raises(ValueError, match="only loads model folders"):
        attnviz.load_model(str(tmp_path))


def test_streamlit_upload_cap_agrees_with_limits():
    import tomllib
    from pathlib import Path
    cfg = tomllib.loads((Path(__file__).parent.parent / ".streamlit" / "config.toml").read_text())
    # the browser widget counts MB as 10**6 bytes (1024**2 only on Windows): see test_image_uploads
    assert cfg["server"]["maxUploadSize"] * 10**6 == Limits().max_upload_bytes
    assert cfg["server"]["enableXsrfProtection"] is True


def test_lab_views_are_bounded_in_tokens():
    from attnviz.analysis import equivariance, variant_fidelity
    from attnviz.base.limits import LIMITS
    model = attnviz.load_model("minilm")
    long_text = "word " * 2000  # 2,002 tokens before the model's own 512-position cut
    perm = equivariance.permutation_test(model, long_text)
    assert len(perm.tokens) == min(LIMITS.lab_max_tokens, 512)
    fid = variant_fidelity.variant_fidelity(model, long_text, "relu", repeats=1)
    assert fid.cosine is not None


@pytest.mark.parametrize("text", ["![x](http://evil.example/a.png)", "[click](javascript:alert(1))",
                                  "<img src=x onerror=alert(1)>", "**bold** _it_ `code` # head",
                                  "C:\\path\\to\\model", "$x^2$ | a | b |"])
def test_user_text_shows_as_typed_in_markdown(text):
    from markdown_it import MarkdownIt

    from attnviz.ui.common import plain
    html = MarkdownIt("commonmark").render(plain(text))
    assert "<a " not in html and "<img" not in html and "<strong" not in html and "<code" not in html
    assert "<h1" not in html and "<em" not in html
    # what the reader sees is the text itself (HTML-escaped by the renderer)
    import html as html_lib
    assert html_lib.unescape(html.strip().removeprefix("<p>").removesuffix("</p>")) == text


def test_the_app_needs_an_allow_list_and_unresolvable_entries_allow_nothing(tmp_path):
    (tmp_path / "m" / "a").mkdir(parents=True)
    with pytest.raises(ValueError, match="loads no local model folders"):
        Limits().check_model_dir(tmp_path / "m" / "a", required=True)
    lim = Limits(allowed_model_dirs=str(tmp_path / "m"))
    assert lim.check_model_dir("a", required=True) == (tmp_path / "m" / "a").resolve()  # relative: inside
    assert lim.check_model_dir(f"{tmp_path}/m/./a/", required=True) == (tmp_path / "m" / "a").resolve()
    loop = tmp_path / "loop"
    loop.symlink_to(loop)
    for entry in (str(loop), "~no_such_user_here"):   # an entry that cannot resolve allows nothing,
        with pytest.raises(ValueError, match="only loads"):  # in the library too
            Limits(allowed_model_dirs=entry).check_model_dir(tmp_path / "m" / "a")
