"""Loading from folders and the bad inputs the core must refuse with a clear ValueError."""
import json

import pytest
import torch
import transformers as tf
from safetensors.torch import save_file

import attnviz
from attnviz.loading import load_dir
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
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "t5"}))
    with pytest.raises(ValueError, match="supported: bert, gpt2, llama, vit, dinov2"):
        attnviz.load_model(str(tmp_path))
    with pytest.raises(ValueError, match="not supported"):
        attnviz.from_hf(tf.T5Model(tf.T5Config(d_model=16, d_ff=16, num_layers=1, num_heads=2, d_kv=8,
                                               vocab_size=20)))


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
