"""Loading from folders and the bad inputs the core must refuse with a clear ValueError."""
import json
import os
from pathlib import Path

import pytest
import torch
import transformers as tf
from safetensors.torch import save_file

import attnviz
from attnviz.weights.folders import load_dir
from tests.test_parity import close, inputs, reference, tiny


@pytest.mark.parametrize("family", ["bert", "gpt2", "llama_untied", "vit", "dinov2"])
def test_local_folder_round_trip(tmp_path, family):
    hf = tiny(family)
    hf.save_pretrained(tmp_path)
    ours = attnviz.load_model(str(tmp_path))
    x = inputs(hf)
    hidden, att, logits = reference(hf, x)
    tr = ours.trace(x)
    close(tr.attentions, att)
    close(tr.logits if logits is not None else tr.hidden, logits[0] if logits is not None else hidden)


def test_old_vit_tensor_names_on_disk(tmp_path):
    """Checkpoints written before transformers 5 use encoder.layer.N.attention.attention.query."""
    hf = tiny("vit")
    sd = hf.state_dict()
    renames = {"attention.q_proj": "attention.attention.query", "attention.k_proj": "attention.attention.key",
               "attention.v_proj": "attention.attention.value", "attention.o_proj": "attention.output.dense",
               "mlp.fc1": "intermediate.dense", "mlp.fc2": "output.dense"}
    old = {}
    for k, v in sd.items():
        for new, was in renames.items():
            k = k.replace(new, was)
        old[k.replace("layers.", "encoder.layer.")] = v.contiguous()
    save_file(old, str(tmp_path / "model.safetensors"))
    hf.config.save_pretrained(tmp_path)
    x = inputs(hf)
    close(attnviz.load_model(str(tmp_path)).trace(x).hidden, reference(hf, x)[0])


def test_bin_weights_load_without_unpickling_code(tmp_path):
    hf = tiny("gpt2")
    hf.config.save_pretrained(tmp_path)
    torch.save(hf.state_dict(), tmp_path / "pytorch_model.bin")
    x = inputs(hf)
    close(load_dir(tmp_path).trace(x).logits, reference(hf, x)[2][0])


class Evil:
    def __reduce__(self):
        return (exec, ("import sys; sys.exit('pwned')",))


def test_malicious_bin_is_refused(tmp_path):
    tiny("gpt2").config.save_pretrained(tmp_path)
    torch.save({"x": Evil()}, tmp_path / "pytorch_model.bin")
    with pytest.raises(ValueError, match="corrupt or unreadable"):
        load_dir(tmp_path)


def test_unknown_key_lists_choices():
    with pytest.raises(ValueError, match="minilm"):
        attnviz.load_model("bert-base-uncased")


def test_folder_problems(tmp_path):
    with pytest.raises(ValueError, match="not a folder"):
        attnviz.load_model(str(tmp_path / "nope"))
    with pytest.raises(ValueError, match="no config.json"):
        attnviz.load_model(str(tmp_path))
    tiny("bert").config.save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="no weights"):
        attnviz.load_model(str(tmp_path))
    (tmp_path / "model.safetensors").write_bytes(b"\x00garbage" * 10)
    with pytest.raises(ValueError, match="corrupt"):
        attnviz.load_model(str(tmp_path))


def test_unsupported_architecture(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "pegasus"}))
    with pytest.raises(ValueError, match="supported: bert, gpt2, llama, .*vit, dinov2.*translation marian, bart"):
        attnviz.load_model(str(tmp_path))
    with pytest.raises(ValueError, match="not supported"):
        attnviz.from_hf(tf.PegasusModel(tf.PegasusConfig(d_model=16, encoder_layers=1, decoder_layers=1,
                                                         encoder_attention_heads=2, decoder_attention_heads=2,
                                                         encoder_ffn_dim=16, decoder_ffn_dim=16, vocab_size=20)))


def test_weights_that_do_not_fit(tmp_path):
    hf = tiny("bert")
    hf.save_pretrained(tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    cfg["intermediate_size"] = 50
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="do not fit"):
        attnviz.load_model(str(tmp_path))


@pytest.fixture(scope="module")
def gpt2():
    return attnviz.from_hf(tiny("gpt2"))


def test_bad_head_masks(gpt2):
    with pytest.raises(ValueError, match=r"shape \[2, 4\]"):
        gpt2.trace([1, 2, 3], head_mask=torch.ones(3, 4))
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        gpt2.trace([1, 2, 3], head_mask=torch.full((2, 4), 2.0))
    with pytest.raises(ValueError, match=r"shape"):
        gpt2.prune(torch.ones(2, 5, dtype=torch.bool))


def test_bad_token_ids_and_text(gpt2):
    with pytest.raises(ValueError, match="no tokenizer"):
        gpt2.trace("hello")
    with pytest.raises(ValueError, match=r"\[0, 99\)"):
        gpt2.trace([1, 500])
    with pytest.raises(ValueError, match="no token ids"):
        gpt2.trace([])
    with pytest.raises(ValueError, match="positions"):
        gpt2.trace(list(range(65)))
    with pytest.raises(ValueError, match="takes text"):
        gpt2.trace(torch.randn(3, 8, 8))


def test_bad_image_tensors():
    vit = attnviz.from_hf(tiny("vit"))
    for bad in (torch.randn(8, 8), torch.randn(1, 3, 32, 32), torch.randn(3, 30, 32), torch.randn(4, 32, 32)):
        with pytest.raises(ValueError, match="image"):
            vit.trace(bad)
    with pytest.raises(ValueError, match="takes images"):
        vit.trace("a photo of a cat")


def test_list_models_has_bundled_keys():
    keys = {m.key for m in attnviz.list_models()}
    assert {"minilm", "smollm2", "dinov2"} <= keys


# ---------------------------------------------------------------- hostile folders
# Every failure is a ValueError, nothing is read before its size and kind are checked, nothing is
# allocated before the config's sizes are bounded, and no message shows where a path resolves.
from attnviz.weights import folders  # noqa: E402
from attnviz.base.limits import Limits  # noqa: E402


def bert_folder(path, **config):
    tiny("bert").save_pretrained(path)
    if config:
        cfg = json.loads((path / "config.json").read_text())
        cfg.update(config)
        (path / "config.json").write_text(json.dumps(cfg))
    return path


def refused(path, match=None, name=None):
    with pytest.raises(ValueError, match=match) as err:
        attnviz.load_model(str(path) if name is None else name)
    return str(err.value)


@pytest.mark.parametrize("special", ["/dev/zero", "fifo", "folder"])
def test_config_json_must_be_a_small_regular_file(tmp_path, special):
    """config.json -> /dev/zero read 6.8 GB before; a FIFO blocked the loader for ever."""
    bert_folder(tmp_path)
    (tmp_path / "config.json").unlink()
    if special == "fifo":
        os.mkfifo(tmp_path / "config.json")
    elif special == "folder":
        (tmp_path / "config.json").mkdir()
    else:
        (tmp_path / "config.json").symlink_to(special)
    refused(tmp_path, "config.json is not a regular file")


@pytest.mark.parametrize("file", ["tokenizer.json", "vocab.txt", "model.safetensors",
                                  "preprocessor_config.json"])
def test_other_files_are_checked_before_anything_opens_them(tmp_path, file):
    bert_folder(tmp_path)
    (tmp_path / file).unlink(missing_ok=True)
    (tmp_path / file).symlink_to("/dev/zero")
    refused(tmp_path, f"{file} is not a regular file")


def test_sizes_are_checked_against_the_budgets_before_reading(tmp_path, monkeypatch, set_limits):
    bert_folder(tmp_path)
    config_bytes = (tmp_path / "config.json").stat().st_size
    set_limits(max_config_bytes=config_bytes - 1)
    refused(tmp_path, r"config.json is .* over the .* limit \(ATTNVIZ_MAX_CONFIG_BYTES\)")

    import safetensors.torch

    def never(*args, **kwargs):
        raise AssertionError("weights read before their size was checked")
    monkeypatch.setattr(safetensors.torch, "load_file", never)
    weight_bytes = (tmp_path / "model.safetensors").stat().st_size
    set_limits(max_config_bytes=Limits().max_config_bytes, max_weight_bytes=weight_bytes - 1)
    refused(tmp_path, r"over the .* limit \(ATTNVIZ_MAX_WEIGHT_BYTES\)")


@pytest.mark.parametrize("change, match", [
    (dict(hidden_size=10**9), "hidden_size must be a whole number"),
    (dict(num_hidden_layers=10**6), "num_hidden_layers must be a whole number"),
    (dict(num_attention_heads=0), "num_attention_heads must be a whole number in 1"),
    (dict(num_attention_heads=5), "must be a multiple of the number of heads"),
    (dict(hidden_size=32.0), "hidden_size"),
    (dict(vocab_size=-1), "vocab_size must be a whole number"),
    (dict(max_position_embeddings=True), "max_position_embeddings"),
    # each value in bounds, together 512 layers x d 65,536: far over the weight budget
    (dict(hidden_size=65_536, num_attention_heads=64, num_hidden_layers=512), "G parameters"),
])
def test_absurd_config_sizes_are_refused_before_allocating(tmp_path, change, match):
    refused(bert_folder(tmp_path, **change), match)


def test_a_huge_rotary_head_is_refused_before_its_table_is_built(tmp_path):
    """head_dim 10**9 made Transformer() build an 8192 x 10**9 RoPE table (a RuntimeError)."""
    tiny("llama_untied").save_pretrained(tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps(dict(cfg, head_dim=10**9)))
    refused(tmp_path, "head_dim must be a whole number")


@pytest.mark.parametrize("content, match", [
    (b"[1, 2, 3]", "must hold a JSON object, not a list"),
    (b'"bert"', "must hold a JSON object"),
    (b"[" * 100_000 + b"]" * 100_000, "nested too deeply|not valid JSON"),
    (b'{"model_type": "bert", "x": "\xff\xfe"}', "not UTF-8"),
    (b'{"model_type": "bert", "hidden_size": ' + b"9" * 5000 + b"}", "refuses to read"),
    (b'{"model_type": ["bert"]}', "not supported"),
    (b'{"model_type": "bert", "hidden_act": {"x": 1}}', "not supported|refuses"),
    (b"{not json", "not valid JSON"),
])
def test_malformed_config_json_is_a_value_error(tmp_path, content, match):
    bert_folder(tmp_path)
    (tmp_path / "config.json").write_bytes(content)
    refused(tmp_path, match)


def test_unreadable_files_and_loops_are_value_errors(tmp_path, monkeypatch):
    loop = tmp_path / "loop"
    loop.symlink_to(loop)
    refused(loop)                                                      # the folder itself loops
    folder = bert_folder(tmp_path / "m")
    (folder / "config.json").unlink()
    (folder / "config.json").symlink_to(folder / "config.json")        # config.json loops
    refused(folder, "config.json cannot be read")
    (folder / "config.json").unlink()
    bert_folder(folder)                                               # whole again
    (folder / "model.safetensors").unlink()
    (folder / "model.safetensors").symlink_to(tmp_path / "gone")      # a broken link
    refused(folder, "model.safetensors cannot be read")
    bert_folder(folder)
    # no permission (the tests may run as root, which ignores file modes: the OS answer is simulated)
    import builtins
    real_os_open, real_open = os.open, builtins.open

    def os_open(path, *args, **kwargs):
        if str(path).endswith("config.json"):
            raise PermissionError(13, "Permission denied", str(path))
        return real_os_open(path, *args, **kwargs)

    def py_open(path, *args, **kwargs):
        if str(path).endswith("config.json"):
            raise PermissionError(13, "Permission denied", str(path))
        return real_open(path, *args, **kwargs)
    monkeypatch.setattr(os, "open", os_open)
    monkeypatch.setattr(builtins, "open", py_open)
    refused(folder, "config.json cannot be read")


def test_messages_name_the_folder_as_typed_never_where_it_resolves(tmp_path):
    target = tmp_path / "secret_target_name"
    bert_folder(target)
    (target / "config.json").write_text("[]")
    (tmp_path / "link").symlink_to(target)
    message = refused(tmp_path / "link", "JSON object")
    assert "link" in message and "secret_target_name" not in message
    (target / "config.json").write_text(json.dumps({"model_type": "bert"}))
    (target / "model.safetensors").write_bytes(b"\x00garbage" * 10)
    for text in (refused(tmp_path / "link"), refused(tmp_path / "link" / "nope")):
        assert "secret_target_name" not in text


def test_the_library_still_loads_any_folder_and_folds_spellings(tmp_path):
    folder = bert_folder(tmp_path / "big")
    (tmp_path / "alias").symlink_to(folder)
    for spelling in (folder, f"{folder}/", tmp_path / "." / "big", tmp_path / "alias"):
        assert attnviz.load_model(str(spelling)).cfg.n_layers == 2


# ---------------------------------------------------------------- the app's picker (AppTest)
from streamlit.testing.v1 import AppTest  # noqa: E402

APP = str(Path(__file__).resolve().parents[1] / "app.py")
PICK = "model_choice:encoder/lm/vision"


def home(**state) -> AppTest:
    import streamlit as st
    st.cache_resource.clear()
    at = AppTest.from_file(APP, default_timeout=300)
    for key, value in state.items():
        at.session_state[key] = value
    return at.run()


def errors(at) -> list[str]:
    return [e.value for e in at.error]


def test_app_offers_no_local_folders_without_an_allow_list(tmp_path):
    bert_folder(tmp_path)
    at = home()
    assert not at.exception
    assert "local folder…" not in at.sidebar.selectbox(key=PICK).options
    # a session that still asks for one (an old session state) gets the default model instead
    at = home(**{PICK: "local folder…", "model_custom_dir": str(tmp_path)})
    assert not at.exception and at.sidebar.selectbox(key=PICK).value == "minilm"
    assert not any(str(tmp_path) in c.value for c in at.caption)
    from attnviz.ui import common
    with pytest.raises(ValueError, match="unknown model|not a Hugging Face model name"):
        common.shared_model(str(tmp_path))                  # the app's cached loader takes no paths


def test_app_refusals_say_the_same_for_missing_outside_and_unreadable(tmp_path, monkeypatch, set_limits):
    from attnviz.ui import common
    models, secret = tmp_path / "models", tmp_path / "secret_place"
    bert_folder(models / "big")
    secret.mkdir()
    (models / "escape").symlink_to(secret)
    (models / "loop").symlink_to(models / "loop")
    set_limits(allowed_model_dirs=str(models))
    typed_names = [str(secret), "/root/.ssh", "/proc/self/cwd", "/no/such/folder", str(models / "escape"),
                   str(models / "loop"), str(models / "missing"), "../secret_place", "~root",
                   str(models / "big" / "config.json")]
    seen = set()
    for typed in typed_names:
        at = home(**{PICK: "local folder…", "model_custom_dir": typed})
        assert not at.exception, typed
        [message] = errors(at)
        assert common.plain(repr(typed)) in message
        seen.add(message.replace(common.plain(repr(typed)), "<typed>"))
        assert common.plain(str(secret)) not in message.replace(common.plain(repr(typed)), "")
    assert len(seen) == 1, seen                        # indistinguishable
    assert "only loads model folders under" in seen.pop()
    at = home(**{PICK: "local folder…", "model_custom_dir": "big"})   # relative to the allowed folder
    assert not at.exception and not errors(at)
    assert "Loaded: " + common.plain(str(models / "big")) in [h.value for h in at.subheader]


def test_app_loads_one_copy_per_resolved_folder(tmp_path, monkeypatch, set_limits):
    """/x/big and /x/big/ (and /x/./big, a symlink to it) loaded twice before: +2.7 GB each."""
    from attnviz.ui import common
    models = tmp_path / "models"
    folder = bert_folder(models / "big")
    (models / "alias").symlink_to(folder)
    set_limits(allowed_model_dirs=str(models))
    loads = []
    real = folders.load_dir

    def counted(*args, **kwargs):
        loads.append(args[0])
        return real(*args, **kwargs)
    monkeypatch.setattr(folders, "load_dir", counted)
    import streamlit as st
    st.cache_resource.clear()
    fingerprints = set()
    for typed in (str(folder), f"{folder}/", f"{models}/./big", str(models / "alias"), "big"):
        at = AppTest.from_file(APP, default_timeout=300)
        at.session_state[PICK] = "local folder…"
        at.session_state["model_custom_dir"] = typed
        at.run()
        assert not at.exception and not errors(at), typed
        fingerprints.add(at.code[0].value)
    assert len(loads) == 1 and len(fingerprints) == 1


def test_shared_models_leave_the_collectors_view_and_are_still_freed_when_dropped(monkeypatch):
    """ui.settle_heap freezes what is alive after a load, so Streamlit's collection after every run
    no longer walks torch, transformers and the weights (~250 ms per run with SmolLM2 loaded).
    Frozen objects are freed by reference counting alone: a dropped model must not need the
    collector (a cycle in it would leak it once frozen)."""
    import gc
    import weakref
    from attnviz.ui import common
    before = gc.get_freeze_count()
    common.settle_heap()
    assert gc.get_freeze_count() > before
    settled = []
    monkeypatch.setattr(common, "settle_heap", lambda: settled.append(True))
    common.forget_loaded()
    common.shared_model("toy-copy")
    assert settled                                       # every shared load settles the heap
    for key in ("toy-copy", "minilm"):
        model = attnviz.load_model(key)
        gc.freeze()
        gone = weakref.ref(model)
        enabled = gc.isenabled()
        gc.disable()
        try:
            del model
            assert gone() is None, key
        finally:
            if enabled:
                gc.enable()


# ---------------------------------------------------------------- the family registry
def test_core_checks_structure_and_takes_a_family_name_as_a_label():
    from attnviz.core.config import Config
    from attnviz.weights.catalogue import random_model
    shape = dict(n_layers=1, n_heads=2, n_kv_heads=2, d_model=8, d_head=4, d_ff=16, vocab_size=11)
    model = random_model(Config(family="my-new-family", task="encoder", embedding_norm=True, **shape))
    assert model.info.family == "my-new-family" and model.info.task == "encoder"
    assert model.net.emb_norm is not None and model.net.lm_head is None
    assert model.trace([1, 2, 3]).attentions.shape[-1] == 3
    for bad, message in [(dict(family=""), "family must be a non-empty name"),
                         (dict(task="speech"), "task must be one of encoder, lm, vision"),
                         (dict(norm="batchnorm"), "norm must be one of"),
                         (dict(positional="xpos"), "positional must be one of"),
                         (dict(patch_size=4), "a vision config has a patch size")]:
        with pytest.raises(ValueError, match=message):
            Config(**{"family": "x", "task": "lm", **shape, **bad})


def test_the_registry_answers_for_every_family():
    from attnviz.weights.families import FAMILIES, family, hf_family, synthetic_preset
    assert family("bergamot").TASK == "translation" and hf_family("whisper").TASK == "speech"
    assert {f.TASK for f in FAMILIES.values()} == {"encoder", "lm", "vision", "audio", "translation", "speech"}
    with pytest.raises(ValueError, match="not registered; registered: bert, gpt2"):
        family("pegasus")
    with pytest.raises(ValueError, match="and for translation marian, bart, mbart, m2m_100, t5, mt5, and for speech whisper"):
        hf_family("pegasus")
    with pytest.raises(ValueError, match="'bergamot' is not supported"):  # no transformers half
        hf_family("bergamot")
    assert synthetic_preset("bert")["embedding_norm"] and not synthetic_preset("gpt2").get("embedding_norm")
    with pytest.raises(ValueError, match="family must be one of bert, gpt2, llama, .*vit, dinov2"):
        synthetic_preset("marian")


def test_a_converted_bert_has_its_embedding_norm_and_the_cache_key_moves_with_its_version(tmp_path, monkeypatch):
    """The family file, not a branch on its name, gives BERT its LayerNorm after the embeddings;
    and an entry converted under another cache version is never the one read."""
    from attnviz.weights import conversion_cache
    assert attnviz.from_hf(tiny("bert")).cfg.embedding_norm
    assert not attnviz.from_hf(tiny("gpt2")).cfg.embedding_norm
    source = tmp_path / "model.bin"
    source.write_bytes(b"x")
    now = conversion_cache.source_key(source)
    monkeypatch.setattr(conversion_cache, "CACHE_VERSION", conversion_cache.CACHE_VERSION - 1)
    assert conversion_cache.source_key(source) != now
