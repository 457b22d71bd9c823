"""The two-tower families (CLIP, SigLIP) against transformers eager on tiny random models: each
tower's hidden states and every attention, the pooled embeddings and the captions' scores, the
pooling probe's attention, a head mask and pruning of the vision tower, a folder round trip and a
Hub-cache load by name. Tokenizers are built here, offline."""
import pytest
import torch
import transformers as tf

import attnviz
from attnviz.core.dual import DualModel
from attnviz.weights import hub
from tests.hub_cache import lay_out
from tests.test_parity import TOL, close, output_projection

WORDS = ["<pad>", "<eos>", "<bos>", "[UNK]", "a", "photo", "of", "cat", "dog", "the", "on", "mat", "red", "car"]
PAD, EOS, BOS = 0, 1, 2
CAPTIONS = ["a photo of cat", "the dog on mat", "a red car photo"]   # one length: the reference batches them
TOWER = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37)
DUAL = {
    "clip": ("CLIPModel", "CLIPConfig", dict(projection_dim=16)),
    "clip_legacy_eos": ("CLIPModel", "CLIPConfig", dict(projection_dim=16)),   # eos id 2: pooled at the highest id
    "siglip": ("SiglipModel", "SiglipConfig", {}),
}


def tokenizer(family: str):
    """A word-level tokenizer that adds the specials the family's own does (CLIP: <bos> ... <eos>;
    SigLIP: ... <eos>, padded to the positions by the model)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    template = "$A <eos>" if family.startswith("siglip") else "<bos> $A <eos>"
    tok.post_processor = processors.TemplateProcessing(single=template, special_tokens=[("<bos>", BOS), ("<eos>", EOS)])
    return tf.PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", eos_token="<eos>", bos_token="<bos>",
                                      pad_token="<pad>")


def tiny_dual(family: str):
    torch.manual_seed(0)
    cls_name, make, fields = DUAL[family]
    eos = 2 if family == "clip_legacy_eos" else EOS
    text = dict(TOWER, vocab_size=len(WORDS) + 5, max_position_embeddings=12, eos_token_id=eos, bos_token_id=BOS,
                pad_token_id=PAD)
    cfg = getattr(tf, make)(text_config=text, vision_config=dict(TOWER, image_size=32, patch_size=8), **fields)
    cfg._attn_implementation = "eager"
    cfg.text_config._attn_implementation = cfg.vision_config._attn_implementation = "eager"
    model = getattr(tf, cls_name)(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name or name.endswith("bias") or "probe" in name or "class_embedding" in name:
                p.add_(torch.randn_like(p) * 0.3)
        model.logit_scale.fill_(1.5)
    return model


def pixels():
    torch.manual_seed(1)
    return torch.randn(3, 32, 32)


def ids_of(family, ours: DualModel):
    return [ours.caption_ids(c) for c in CAPTIONS]


def reference(hf, px, ids, head_mask=None):
    """transformers eager: both towers' outputs and attentions and the scores; a head mask on the
    vision tower through a pre-hook on each layer's output projection."""
    hooks = []
    if head_mask is not None:
        for layer, block in enumerate(hf.vision_model.encoder.layers):
            def hook(mod, args, layer=layer):
                (h,) = args
                return (h * head_mask[layer].repeat_interleave(h.shape[-1] // head_mask.shape[1]),)
            hooks.append(output_projection(block).register_forward_pre_hook(hook))
    try:
        with torch.no_grad():
            out = hf(input_ids=torch.stack(ids), pixel_values=px[None], output_attentions=True)
    finally:
        for h in hooks:
            h.remove()
    return out


@pytest.fixture(scope="module", params=list(DUAL))
def pair(request):
    family = request.param
    hf = tiny_dual(family)
    return family, hf, attnviz.from_hf(hf, tokenizer(family))


def test_towers_embeddings_and_scores_match(pair):
    family, hf, ours = pair
    assert isinstance(ours, DualModel) and ours.kind == "vision"
    px = pixels()
    ids = ids_of(family, ours)
    want = reference(hf, px, ids)
    match = ours.match(px, CAPTIONS)
    vision = want.vision_model_output
    close(match.image.hidden, vision.last_hidden_state[0])
    close(match.image.attentions, torch.stack([a[0] for a in vision.attentions]))
    text = want.text_model_output
    for i, t in enumerate(match.texts):
        close(t.hidden, text.last_hidden_state[i])
        close(t.attentions, torch.stack([a[i] for a in text.attentions]))
        assert t.attentions[:, :, 0, 1:].abs().max() == 0 if family.startswith("clip") else True   # causal
    close(match.image_embedding, torch.nn.functional.normalize(want.image_embeds[0], dim=-1))
    close(match.text_embeddings, torch.nn.functional.normalize(want.text_embeds, dim=-1))
    close(match.logits, want.logits_per_image[0])
    if family == "siglip":
        close(match.probs, torch.sigmoid(want.logits_per_image[0]))
        assert match.probe and match.image_reads.shape == (1, 4, 16)
        close(match.image_reads.sum(-1), torch.ones(1, 4))
    else:
        close(match.probs.sum(), torch.tensor(1.0))
        close(match.image_reads, match.image.attentions[:, :, 0])
    for reads, t, i in zip(match.text_reads, match.texts, match.pooled):
        close(reads, t.attentions[:, :, i])


def test_siglip_probe_equals_the_reference_pooling_head():
    hf = tiny_dual("siglip")
    ours = attnviz.from_hf(hf, tokenizer("siglip"))
    px = pixels()
    with torch.no_grad():
        hidden = hf.vision_model(pixel_values=px[None]).last_hidden_state
        head = hf.vision_model.head
        probe = head.probe.repeat(1, 1, 1)
        _, weights = head.attention(probe, hidden, hidden, need_weights=True, average_attn_weights=False)
    match = ours.match(px, CAPTIONS[:1])
    close(match.image_reads, weights[0].transpose(0, 1))     # (h, 1, n) -> (1, h, n)


def test_vision_head_mask_and_pruning(pair):
    family, hf, ours = pair
    px = pixels()
    ids = ids_of(family, ours)
    torch.manual_seed(2)
    mask = torch.rand(2, 4)
    mask[0, 1] = 0.0
    want = reference(hf, px, ids, head_mask=mask)
    match = ours.match(px, CAPTIONS, head_mask=mask)
    close(match.image.hidden, want.vision_model_output.last_hidden_state[0])
    close(match.logits, want.logits_per_image[0])
    keep = torch.ones(2, 4, dtype=torch.bool)
    keep[0, 0] = keep[1, 3] = False
    small = ours.prune(keep)
    assert isinstance(small, DualModel) and small.num_params() < ours.num_params()
    close(small.match(px, CAPTIONS).logits, ours.match(px, CAPTIONS, head_mask=keep.float()).logits, 1e-5)


@pytest.mark.parametrize("family", ["clip", "siglip"])
def test_folder_and_hub_cache_round_trip(family, tmp_path, monkeypatch):
    root = tmp_path / "hf" / "hub"
    monkeypatch.setenv("HF_HUB_CACHE", str(root))
    monkeypatch.setenv("ATTNVIZ_CACHE", str(tmp_path / "converted"))
    monkeypatch.setattr(hub, "HfApi", None)
    monkeypatch.setattr(hub, "snapshot_download", None)
    folder = tmp_path / family
    hf = save_dual(folder, family)
    px = pixels()
    from_folder = attnviz.load_model(str(folder))
    want = reference(hf, px, ids_of(family, from_folder))
    close(from_folder.match(px, CAPTIONS).logits, want.logits_per_image[0])
    lay_out(root, f"org/{family}", folder)
    by_name = attnviz.load_model(f"org/{family}")
    assert by_name.cfg == from_folder.cfg
    close(by_name.match(px, CAPTIONS).logits, want.logits_per_image[0])


def save_dual(folder, family):
    """A folder of a tiny two-tower model with its tokenizer, as users bring one."""
    hf = tiny_dual(family)
    hf.save_pretrained(folder)
    tokenizer(family).save_pretrained(folder)
    return hf


def test_unsupported_caption_input_is_refused():
    ours = attnviz.from_hf(tiny_dual("clip"), tokenizer("clip"))
    with pytest.raises(ValueError, match="list of one or more captions"):
        ours.match(pixels(), "a cat")
    with pytest.raises(ValueError, match="empty"):
        ours.match(pixels(), [" "])


# ---------------------------------------------------------------- BLIP: text attending to the image
BLIP_WORDS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "a", "photo", "of", "cat", "dog", "the", "on", "mat"]


def blip_tokenizer():
    """BERT's specials around the words: [CLS] ... [SEP]."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(BLIP_WORDS)}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.post_processor = processors.TemplateProcessing(single="[CLS] $A [SEP]", special_tokens=[("[CLS]", 2), ("[SEP]", 3)])
    return tf.PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", cls_token="[CLS]", sep_token="[SEP]",
                                      pad_token="[PAD]")


def tiny_blip():
    torch.manual_seed(0)
    text = dict(TOWER, vocab_size=len(BLIP_WORDS) + 3, max_position_embeddings=16, encoder_hidden_size=32,
                bos_token_id=2, sep_token_id=3, pad_token_id=0)
    # BLIP's vision tower initialises at a scale of 1e-10 (uniform attention): a usual scale instead
    vision = dict(TOWER, image_size=32, patch_size=8, initializer_range=0.02)
    cfg = tf.BlipConfig(text_config=text, vision_config=vision, projection_dim=16)
    cfg._attn_implementation = cfg.text_config._attn_implementation = cfg.vision_config._attn_implementation = "eager"
    model = tf.BlipForImageTextRetrieval(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name.lower() or name.endswith("bias") or "embedding" in name:
                p.add_(torch.randn_like(p) * 0.3)
    return model


def blip_reference(hf, px, ids, cross_mask=None):
    hooks = []
    if cross_mask is not None:
        for layer, block in enumerate(hf.text_encoder.encoder.layer):
            def hook(mod, args, layer=layer):
                (h,) = args
                return (h * cross_mask[layer].repeat_interleave(h.shape[-1] // cross_mask.shape[1]),)
            hooks.append(block.crossattention.output.dense.register_forward_pre_hook(hook))
    try:
        with torch.no_grad():
            image = hf.vision_model(pixel_values=px[None], output_attentions=True)
            text = hf.text_encoder(input_ids=ids[None], encoder_hidden_states=image.last_hidden_state,
                                   output_attentions=True)
            itm = hf(input_ids=ids[None], pixel_values=px[None]).itm_score
    finally:
        for h in hooks:
            h.remove()
    return image, text, itm


@pytest.fixture(scope="module")
def blip():
    hf = tiny_blip()
    return hf, attnviz.from_hf(hf, blip_tokenizer())


def test_blip_cross_attention_and_matching_equal_the_reference(blip):
    hf, ours = blip
    px = pixels()
    reading = ours.read(px, "a photo of cat on the mat")
    image, text, itm = blip_reference(hf, px, reading.ids)
    assert reading.tokens[0] == "[CLS]" and reading.tokens[-1] == "[SEP]"
    close(reading.image.hidden, image.last_hidden_state[0])
    close(reading.image.attentions, torch.stack([a[0] for a in image.attentions]))
    close(reading.hidden, text.last_hidden_state[0])
    close(reading.self_attentions, torch.stack([a[0] for a in text.attentions]))
    close(reading.cross_attentions, torch.stack([a[0] for a in text.cross_attentions]))
    close(torch.tensor(reading.match), torch.softmax(itm[0], -1)[1])
    assert reading.patch_attentions.shape == (2, 4, 9, 4, 4)   # 7 words and [CLS], [SEP] over 4 x 4 patches


def test_blip_cross_heads_switched_off_and_vision_pruning(blip):
    hf, ours = blip
    px = pixels()
    cross_mask = torch.ones(2, 4)
    cross_mask[0, 1] = cross_mask[1, 3] = 0.0
    reading = ours.read(px, "the dog on the mat", cross_mask=cross_mask)
    _, text, _ = blip_reference(hf, px, reading.ids, cross_mask=cross_mask)
    close(reading.hidden, text.last_hidden_state[0])
    close(reading.cross_attentions, torch.stack([a[0] for a in text.cross_attentions]))  # masked heads still shown
    keep = torch.ones(2, 4, dtype=torch.bool)
    keep[0, 2] = False
    small = ours.prune(keep)
    assert small.num_params() < ours.num_params()
    close(small.read(px, "a cat").hidden, ours.read(px, "a cat", head_mask=keep.float()).hidden, 1e-5)
    with pytest.raises(ValueError, match="cross_mask must be"):
        ours.read(px, "a cat", cross_mask=torch.ones(3, 4))


def test_blip_folder_and_hub_cache_round_trip(tmp_path, monkeypatch):
    root = tmp_path / "hf" / "hub"
    monkeypatch.setenv("HF_HUB_CACHE", str(root))
    monkeypatch.setattr(hub, "HfApi", None)
    monkeypatch.setattr(hub, "snapshot_download", None)
    folder = tmp_path / "blip"
    hf = save_blip(folder)
    px = pixels()
    from_folder = attnviz.load_model(str(folder))
    reading = from_folder.read(px, "a photo of dog")
    _, text, _ = blip_reference(hf, px, reading.ids)
    close(reading.hidden, text.last_hidden_state[0])
    lay_out(root, "org/blip", folder)
    by_name = attnviz.load_model("org/blip")
    close(by_name.read(px, "a photo of dog").cross_attentions, reading.cross_attentions)


def save_blip(folder):
    hf = tiny_blip()
    hf.save_pretrained(folder)
    blip_tokenizer().save_pretrained(folder)
    return hf
