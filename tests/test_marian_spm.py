"""Marian folders in the layout opus-mt repos have: source.spm and target.spm (a SentencePiece model
per side) and one vocab.json, no tokenizer.json. Both SentencePiece models are trained here on a few
dozen sentences, with a tiny random MarianMTModel over their vocabulary: the folder and the same
files in a Hugging Face cache load by path and by name, read text with transformers' MarianTokenizer
(the target side with the target model), translate and attend as transformers eager does, and the
Translate page runs on them.

The table-driven seq2seq parity rows (tests/test_parity.py) read a word-level tokenizer built over a
fixed 99-entry vocabulary; this layout needs a vocabulary trained from text, so it is its own module
reusing that table's Marian row and reference."""
import io
import json

import pytest
import sentencepiece
import streamlit as st
import torch
import transformers as tf
from streamlit.testing.v1 import AppTest

import attnviz
from attnviz.core import tokens
from tests import hub_cache
from tests.test_page_translate import PAGE, charts_of_every_view
from tests.test_parity import SEQ2SEQ, close, s2s_reference

EN = ["the cat sat on the mat", "a dog ran in the park", "hello world", "the house is small",
      "I like green tea", "she reads a book", "we walk to school", "they eat bread and cheese"] * 4
PT = ["o gato sentou no tapete", "um cão correu no parque", "olá mundo", "a casa é pequena",
      "eu gosto de chá verde", "ela lê um livro", "nós andamos para a escola", "eles comem pão e queijo"] * 4
REPO = "Helsinki-NLP/opus-mt-en-pt"
SOURCE, TARGET = "the cat sat on the green mat", "o gato verde come pão"


def train(lines: list[str], path) -> list[str]:
    """A unigram SentencePiece model as opus-mt's are laid out (</s> 0, <unk> 1, no <s>); its pieces."""
    model = io.BytesIO()
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(lines), model_writer=model, vocab_size=40, model_type="unigram",
        character_coverage=1.0, bos_id=-1, eos_id=0, unk_id=1, pad_id=-1, hard_vocab_limit=False,
        minloglevel=2)
    path.write_bytes(model.getvalue())
    sp = sentencepiece.SentencePieceProcessor(model_file=str(path))
    return [sp.id_to_piece(i) for i in range(sp.get_piece_size())]


def opus_mt_folder(folder, seed: int = 0) -> tf.MarianMTModel:
    """source.spm, target.spm, vocab.json (both sides' pieces, <pad> last, as opus-mt's), a
    tokenizer_config.json naming the languages, and a tiny random MarianMTModel over that vocabulary."""
    vocab = {}
    for piece in train(EN, folder / "source.spm") + train(PT, folder / "target.spm"):
        vocab.setdefault(piece, len(vocab))
    vocab["<pad>"] = len(vocab)
    (folder / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False))
    (folder / "tokenizer_config.json").write_text(json.dumps({"source_lang": "en", "target_lang": "pt"}))
    _, _, fields = SEQ2SEQ["marian"]
    n = len(vocab)
    torch.manual_seed(seed)
    hf = tf.MarianMTModel(tf.MarianConfig(**dict(fields, vocab_size=n, pad_token_id=n - 1, decoder_start_token_id=n - 1),
                                          attn_implementation="eager")).eval()
    with torch.no_grad():   # norms and biases start at constants: make them random too
        for name, p in hf.named_parameters():
            if "norm" in name or name.endswith("bias"):
                p.add_(torch.randn_like(p) * 0.3)
    hf.save_pretrained(folder)
    return hf


@pytest.fixture(scope="module")
def opus(tmp_path_factory):
    folder = tmp_path_factory.mktemp("opus-mt")
    hf = opus_mt_folder(folder)
    assert not (folder / "tokenizer.json").exists()
    with hub_cache.offline_cache(tmp_path_factory.mktemp("hf") / "hub") as root:
        hub_cache.lay_out(root, REPO, folder)
        yield folder, hf, tf.MarianTokenizer.from_pretrained(str(folder))


@pytest.fixture(scope="module", params=["folder", "name"])
def ours(request, opus):
    folder, _, _ = opus
    return attnviz.load_model(str(folder) if request.param == "folder" else REPO)


def test_it_reads_text_with_marian_tokenizer_each_side_with_its_own_model(opus, ours):
    _, _, tok = opus
    assert isinstance(ours.pieces.tokenizer, tf.MarianTokenizer)
    tr = ours.trace(SOURCE, target=TARGET)
    assert tr.source_ids.tolist() == tok(SOURCE).input_ids
    assert tr.target_ids.tolist() == tok(text_target=TARGET).input_ids
    assert tok(text_target=TARGET).input_ids != tok(TARGET).input_ids   # the target model is not the source's
    # labels are the pieces' text: SentencePiece's word-start mark read as the space it stands for
    assert [tokens.plain(t) for t in tr.source_tokens] == \
        [p.replace("▁", " ") for p in tok.convert_ids_to_tokens(tok(SOURCE).input_ids)]
    # a source read after a target is read with the source model again
    assert ours.trace(SOURCE, target=TARGET).source_ids.tolist() == tok(SOURCE).input_ids


def test_translation_and_every_attention_match_transformers_eager(opus, ours):
    _, hf, tok = opus
    src = tok(SOURCE, return_tensors="pt").input_ids
    tgt = tok(text_target=TARGET).input_ids
    tr = ours.trace(SOURCE, target=TARGET)
    ref = s2s_reference(hf, src, torch.tensor([[ours.cfg.decoder_start_id] + tgt[:-1]]))
    close(tr.encoder_attentions, torch.cat(ref.encoder_attentions))
    close(tr.self_attentions, torch.cat(ref.decoder_attentions))
    close(tr.cross_attentions, torch.cat(ref.cross_attentions))
    close(tr.logprobs, torch.log_softmax(ref.logits[0], -1).gather(1, torch.tensor(tgt)[:, None])[:, 0])
    # greedy decoding: each step's token is transformers' likeliest, and the text is MarianTokenizer's
    t = ours.translate(SOURCE, max_tokens=8)
    ids = t.target_ids.tolist()
    ref = s2s_reference(hf, src, torch.tensor([[ours.cfg.decoder_start_id] + ids[:-1]]))
    logits = ref.logits[0].clone()
    logits[:, ours.cfg.pad_id] = float("-inf")   # never chosen: the decoder's own start token
    assert ids == logits.argmax(-1).tolist()
    close(t.cross_attentions, torch.cat(ref.cross_attentions))
    close(t.logprobs, torch.log_softmax(ref.logits[0], -1).gather(1, t.target_ids[:, None])[:, 0])
    assert t.text == tok.decode(ids, skip_special_tokens=True)


def test_the_translate_page_runs_every_view_on_it(opus):
    st.cache_resource.clear()
    at = AppTest.from_file(PAGE, default_timeout=300)
    at.session_state["translate.direction"] = REPO
    at.run()
    assert not at.exception and not at.error, (at.exception, [e.value for e in at.error])
    at.text_area(key="translate.text").input(SOURCE)
    at.button(key="translate.go").click().run()
    assert not at.exception and not at.error, (at.exception, [e.value for e in at.error])
    assert at.subheader
    assert charts_of_every_view(at) >= 8   # the same views as the bundled en-pt model
