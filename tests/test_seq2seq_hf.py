"""Our encoder-decoder against transformers eager on tiny random Marian and BART models built
offline from configs: logits, encoder output, encoder / decoder self- / cross-attentions, masked
heads (the HF reference masks a head with a forward pre-hook on its attention's output projection
that zeroes the head's slice), and greedy decoding with the self-attention cache."""
from __future__ import annotations

import pytest
import torch
import transformers as tf

import attnviz
from attnviz.core.translator import Seq2SeqModel

SIZES = dict(vocab_size=61, d_model=32, encoder_layers=2, decoder_layers=3, encoder_attention_heads=4,
             decoder_attention_heads=4, encoder_ffn_dim=48, decoder_ffn_dim=48, max_position_embeddings=64,
             attn_implementation="eager")
FAMILIES = {
    "marian": (tf.MarianMTModel, tf.MarianConfig,
               dict(pad_token_id=60, eos_token_id=0, decoder_start_token_id=60, scale_embedding=True,
                    activation_function="swish")),
    "bart": (tf.BartForConditionalGeneration, tf.BartConfig, dict(activation_function="gelu")),
}
SRC = [5, 9, 17, 3, 22, 40, 8]
TGT = [7, 8, 11, 30, 12]


def tiny(family: str, seed: int = 0, **changes):
    model_cls, config_cls, extra = FAMILIES[family]
    torch.manual_seed(seed)
    hf = model_cls(config_cls(**{**SIZES, **extra, **changes})).eval()
    with torch.no_grad():
        hf.final_logits_bias.normal_()  # zero by default: a random one checks it is carried over
    return hf


def inputs(hf):
    cfg = hf.config
    src = torch.tensor([SRC + [cfg.eos_token_id]])
    dec = torch.tensor([[cfg.decoder_start_token_id] + TGT])
    return src, dec


def mask_hooks(hf, masks: dict[str, torch.Tensor]):
    """Pre-hooks zeroing masked heads' slices before each attention's output projection.
    masks: 'encoder' / 'self' / 'cross' -> [L, H]."""
    base, handles = hf.model, []
    where = {"encoder": [layer.self_attn for layer in base.encoder.layers],
             "self": [layer.self_attn for layer in base.decoder.layers],
             "cross": [layer.encoder_attn for layer in base.decoder.layers]}
    for name, mask in masks.items():
        for attn, row in zip(where[name], mask):
            dh = attn.head_dim

            def hook(module, args, row=row, dh=dh):
                x = args[0].clone()
                for h in torch.nonzero(row == 0).flatten().tolist():
                    x[..., h * dh:(h + 1) * dh] = 0
                return (x,) + args[1:]
            handles.append(attn.out_proj.register_forward_pre_hook(hook))
    return handles


@pytest.mark.parametrize("family", list(FAMILIES))
def test_logits_hidden_and_every_attention_match_transformers(family):
    hf = tiny(family)
    ours = attnviz.from_hf(hf)
    assert isinstance(ours, Seq2SeqModel) and ours.cfg.family == family and ours.cfg.decoder == "attention"
    src, dec = inputs(hf)
    with torch.no_grad():
        ref = hf(input_ids=src, decoder_input_ids=dec, output_attentions=True)
        memory, enc_att = ours.net.encode(src, need_weights=True)
        out = ours.net.step(dec, ours.net.start(memory), need_weights=True, need_self=True)
    torch.testing.assert_close(memory, ref.encoder_last_hidden_state, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out.logits, ref.logits, atol=1e-5, rtol=1e-5)
    for i in range(2):
        torch.testing.assert_close(enc_att[i], ref.encoder_attentions[i], atol=1e-6, rtol=0)
    for i in range(3):
        torch.testing.assert_close(out.self_att[i], ref.decoder_attentions[i], atol=1e-6, rtol=0)
        torch.testing.assert_close(out.cross[i], ref.cross_attentions[i], atol=1e-6, rtol=0)
    # the public trace: the same tensors, stacked, teacher-forced on the target
    tr = ours.trace(SRC, target=TGT + [hf.config.eos_token_id])
    torch.testing.assert_close(tr.cross_attentions, torch.cat(ref.cross_attentions), atol=1e-6, rtol=0)
    torch.testing.assert_close(tr.self_attentions, torch.cat(ref.decoder_attentions), atol=1e-6, rtol=0)
    torch.testing.assert_close(tr.encoder_attentions, torch.cat(ref.encoder_attentions), atol=1e-6, rtol=0)
    logp = torch.log_softmax(ref.logits[0], -1)
    want = logp.gather(1, torch.tensor(TGT + [hf.config.eos_token_id])[:, None])[:, 0]
    torch.testing.assert_close(tr.logprobs, want, atol=1e-5, rtol=0)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_masked_heads_match_transformers_with_output_projection_hooks(family):
    hf = tiny(family, seed=1)
    ours = attnviz.from_hf(hf)
    src, dec = inputs(hf)
    masks = {"encoder": torch.ones(2, 4), "self": torch.ones(3, 4), "cross": torch.ones(3, 4)}
    masks["encoder"][0, 1] = masks["encoder"][1, 3] = 0
    masks["self"][2, 0] = 0
    masks["cross"][0, 2] = masks["cross"][1, 0] = masks["cross"][1, 1] = 0
    with torch.no_grad():
        plain = hf(input_ids=src, decoder_input_ids=dec).logits
        handles = mask_hooks(hf, masks)
        try:
            ref = hf(input_ids=src, decoder_input_ids=dec, output_attentions=True)
        finally:
            for h in handles:
                h.remove()
        memory, _ = ours.net.encode(src, head_mask=masks["encoder"])
        out = ours.net.step(dec, ours.net.start(memory), head_mask=masks["cross"], self_head_mask=masks["self"])
    assert not torch.allclose(ref.logits, plain, atol=1e-3)
    torch.testing.assert_close(out.logits, ref.logits, atol=1e-5, rtol=1e-5)
    tr = ours.trace(SRC, target=TGT, head_mask=masks["cross"], encoder_head_mask=masks["encoder"],
                    self_head_mask=masks["self"])
    torch.testing.assert_close(tr.logprobs[:-1], torch.log_softmax(ref.logits[0], -1)[:-1].gather(
        1, torch.tensor(TGT)[:, None])[:, 0], atol=1e-5, rtol=0)
    # the masked heads' weights are still what they would attend to
    torch.testing.assert_close(tr.cross_attentions, torch.cat(ref.cross_attentions)[:, :, :len(TGT) + 1],
                               atol=1e-6, rtol=0)


def hf_greedy(hf, n: int) -> list[int]:
    """Greedy decoding by transformers' forward on the whole prefix each step (no cache)."""
    src, _ = inputs(hf)
    prefix = [hf.config.decoder_start_token_id]
    with torch.no_grad():
        for _ in range(n):
            nxt = int(hf(input_ids=src, decoder_input_ids=torch.tensor([prefix])).logits[0, -1].argmax())
            prefix.append(nxt)
            if nxt == hf.config.eos_token_id:
                break
    return prefix[1:]


@pytest.mark.parametrize("family", list(FAMILIES))
def test_cached_greedy_decoding_matches_transformers(family):
    hf = tiny(family, seed=2)
    ours = attnviz.from_hf(hf)
    tr = ours.translate(SRC, max_tokens=12)
    assert tr.target_ids.tolist() == hf_greedy(hf, 12)
    full = ours.translate(SRC, max_tokens=12, cache=False)
    assert torch.equal(tr.target_ids, full.target_ids)
    torch.testing.assert_close(tr.self_attentions, full.self_attentions, atol=1e-5, rtol=0)
    torch.testing.assert_close(tr.cross_attentions, full.cross_attentions, atol=1e-5, rtol=0)
    forced = ours.trace(SRC, target=tr.target_ids.tolist())  # adds the end of sentence if missing
    n = tr.n_tgt
    torch.testing.assert_close(forced.self_attentions[:, :, :n, :n], tr.self_attentions, atol=1e-5, rtol=0)
    torch.testing.assert_close(forced.logprobs[:n], tr.logprobs, atol=1e-5, rtol=0)
    beam = ours.translate(SRC, beam=3, max_tokens=12)
    assert beam.logprob / beam.n_tgt >= tr.logprob / tr.n_tgt - 1e-5


def test_a_model_without_a_shortlist_says_so():
    with pytest.raises(ValueError, match="no lexical shortlist"):
        attnviz.from_hf(tiny("marian")).translate(SRC, shortlist=True)


def test_unsupported_layouts_are_refused_with_a_reason():
    with pytest.raises(ValueError, match="pre-norm"):
        attnviz.from_hf(tiny("bart", normalize_before=True))
    with pytest.raises(ValueError, match="separate source and target"):
        attnviz.from_hf(tiny("marian", share_encoder_decoder_embeddings=False))


def word_tokenizer(hf):
    """A tiny word-level tokenizer over the tiny model's vocabulary (no download, no sentencepiece)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    cfg = hf.config
    specials = {cfg.pad_token_id: "<pad>", cfg.eos_token_id: "</s>"}
    if family_of(hf) == "bart":
        specials.update({cfg.bos_token_id: "<s>", 3: "<unk>"})
    vocab = {specials.get(i, f"w{i}"): i for i in range(cfg.vocab_size)}
    vocab.setdefault("<unk>", 3)
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    return tf.PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="</s>", pad_token="<pad>",
                                      unk_token="<unk>")


def family_of(hf) -> str:
    return hf.config.model_type


@pytest.mark.parametrize("family", list(FAMILIES))
def test_a_local_folder_loads_as_a_translator(family, tmp_path):
    hf = tiny(family, seed=3)
    hf.save_pretrained(tmp_path)
    word_tokenizer(hf).save_pretrained(tmp_path)
    folder = attnviz.load_model(str(tmp_path))
    assert isinstance(folder, Seq2SeqModel) and folder.info.task == "translation"
    text = " ".join(f"w{i}" for i in SRC)
    tr = folder.translate(text, max_tokens=8)
    assert tr.source_ids.tolist() == SRC + [hf.config.eos_token_id]
    assert tr.target_ids.tolist() == attnviz.from_hf(hf).translate(SRC, max_tokens=8).target_ids.tolist()
    assert tr.source_tokens[:2] == ["w5", "w9"] and tr.cross_attentions.shape[-1] == len(SRC) + 1
