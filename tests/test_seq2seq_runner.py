"""The translators and Whisper on the one block runner: mean ablation of their heads, an attention
variant in Whisper's encoder, the per-block check (deadline, cancel) in its 1,500-frame encoder."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

import attnviz
from attnviz.base import jobs
from attnviz.core.attention import EAGER

CLIP = Path(attnviz.__file__).parent / "data" / "audio" / "hello_world.wav"
SENTENCE = "The animal didn't cross the street because it was too tired."


@pytest.fixture(scope="module")
def translator():
    return attnviz.load_model("en-pt")


@pytest.fixture(scope="module")
def whisper():
    return attnviz.load_model("whisper-tiny-en")


@pytest.fixture(scope="module")
def heard(whisper):
    return whisper.transcribe(CLIP.read_bytes())


def cross_mask(model, off=((0, 0), (1, 3))):
    mask = torch.ones(model.cfg.n_dec_layers, model.cfg.n_heads)
    for layer, head in off:
        mask[layer, head] = 0
    return mask


# ---------------------------------------------------------------- mean ablation, translator
def test_translator_head_means_are_each_heads_mean_output(translator):
    tr = translator.translate(SENTENCE)
    means = translator.head_means(tr.source_ids, tr.target_ids)
    c = translator.cfg
    assert means["encoder"].shape == (c.n_enc_layers, c.n_heads, c.d_head)
    assert means["cross"].shape == (c.n_dec_layers, c.n_heads, c.d_head)
    # the runner's per-head outputs, collected by hand, averaged over the target positions
    net, heads = translator.net, {}
    feed = torch.cat([torch.tensor([[c.decoder_start_id]]), tr.target_ids[None, :-1]], 1)
    with torch.inference_mode():
        memory, _ = net.encode(tr.source_ids[None])
        net.step(feed, net.start(memory), heads_out=heads)
    torch.testing.assert_close(means["cross"][1], heads[1][0].mean(1), rtol=0, atol=0)


def test_a_mean_ablated_head_outputs_exactly_its_fill(translator):
    tr = translator.translate(SENTENCE)
    means = translator.head_means(tr.source_ids, tr.target_ids)["cross"]
    mask = cross_mask(translator)
    fill = (1 - mask)[..., None] * means
    net, c, heads = translator.net, translator.cfg, {}
    feed = torch.cat([torch.tensor([[c.decoder_start_id]]), tr.target_ids[None, :-1]], 1)
    with torch.inference_mode():
        memory, _ = net.encode(tr.source_ids[None])
        net.step(feed, net.start(memory), head_mask=mask, head_fill=fill, heads_out=heads)
    for layer, head in ((0, 0), (1, 3)):
        got = heads[layer][0, head]                                   # (n_tgt, d_head)
        assert torch.equal(got, means[layer, head].expand_as(got))
    assert not torch.equal(heads[0][0, 1], means[0, 1].expand_as(heads[0][0, 1]))  # a kept head is its own


def test_translator_mean_ablation_same_on_the_fused_row_path_and_the_step_path(translator):
    tr = translator.translate(SENTENCE)
    means = translator.head_means(tr.source_ids, tr.target_ids)
    mask = cross_mask(translator, off=[(layer, head) for layer in range(2) for head in range(4)])
    fill = (1 - mask)[..., None] * means["cross"]
    rows = translator.translate(SENTENCE, head_mask=mask, head_fill=fill)                # the one-row path
    steps = translator.translate(SENTENCE, head_mask=mask, head_fill=fill, cache=False)  # the block step
    zero = translator.translate(SENTENCE, head_mask=mask)
    assert rows.target_ids.tolist() == steps.target_ids.tolist()
    torch.testing.assert_close(rows.logprobs, steps.logprobs, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(rows.cross_attentions, steps.cross_attentions, atol=1e-5, rtol=1e-4)
    assert not torch.allclose(rows.logprobs[:3], zero.logprobs[:3])   # the fill reaches the output
    traced = translator.trace(SENTENCE, target=rows.target_ids.tolist(), head_mask=mask, head_fill=fill)
    torch.testing.assert_close(traced.logprobs, rows.logprobs, atol=1e-4, rtol=1e-4)


def test_translator_encoder_mean_ablation_changes_the_encoder_only_where_asked(translator):
    tr = translator.translate(SENTENCE)
    means = translator.head_means(tr.source_ids, tr.target_ids)["encoder"]
    c = translator.cfg
    keep = torch.ones(c.n_enc_layers, c.n_heads)
    keep[c.n_enc_layers - 1] = 0                                     # the last encoder layer's heads
    fill = (1 - keep)[..., None] * means
    out = translator.trace(SENTENCE, target=tr.target_ids.tolist(), encoder_head_mask=keep, encoder_head_fill=fill)
    # the layers before the ablated one see the same input: their attention is unchanged
    torch.testing.assert_close(out.encoder_attentions[:-1], tr.encoder_attentions[:-1], atol=1e-6, rtol=0)
    assert not torch.allclose(out.logprobs, tr.logprobs)


@pytest.mark.parametrize("fill, message", [(torch.zeros(2, 8), "shape"), (torch.full((2, 8, 32), float("nan")), "finite")])
def test_translator_rejects_a_bad_fill(translator, fill, message):
    with pytest.raises(ValueError, match=message):
        translator.translate(SENTENCE, head_fill=fill)


# ---------------------------------------------------------------- Whisper: mean ablation, variant, check
def test_whisper_mean_ablation_fills_its_cross_heads(whisper, heard):
    means = whisper.head_means(heard.features, heard.ids)
    c = whisper.cfg
    assert means["cross"].shape == (c.n_dec_layers, c.n_heads, c.d_head)
    assert means["encoder"].shape == (c.n_enc_layers, c.n_heads, c.d_head)
    mask = torch.ones(c.n_dec_layers, c.n_heads)
    mask[:, :3] = 0
    fill = (1 - mask)[..., None] * means["cross"]
    mean = whisper.transcribe(CLIP.read_bytes(), head_mask=mask, head_fill=fill)
    zero = whisper.transcribe(CLIP.read_bytes(), head_mask=mask)
    n = min(len(mean.logprobs), len(zero.logprobs))
    assert not torch.allclose(mean.logprobs[:n], zero.logprobs[:n])
    none = whisper.transcribe(CLIP.read_bytes(), head_mask=torch.ones_like(mask), head_fill=torch.zeros_like(fill))
    assert none.ids.tolist() == heard.ids.tolist() and torch.equal(none.logprobs, heard.logprobs)


def test_whisper_encoder_runs_a_variant(whisper, heard):
    feats = heard.features
    with torch.inference_mode():
        fused, _ = whisper.encode_audio(feats)
        eager, _ = whisper.encode_audio(feats, variant=EAGER)
        local, _ = whisper.encode_audio(feats, variant="local:16")
    torch.testing.assert_close(eager, fused, atol=1e-4, rtol=1e-4)   # the written-out softmax: the same encoder
    assert (local - fused).abs().max() > 1e-2                        # a 16-frame window: another encoder
    assert whisper.transcribe(CLIP.read_bytes(), variant=EAGER).ids.tolist() == heard.ids.tolist()
    # a 16-frame window mishears: it writes until its token limit (a small one, so that a loaded
    # machine cannot reach the time limit first), and is still timed
    banded = whisper.transcribe(CLIP.read_bytes(), variant="local:16", max_tokens=40)
    assert banded.stopped == "max_tokens" and banded.words
    with pytest.raises(ValueError, match="attention variant"):
        whisper.transcribe(CLIP.read_bytes(), variant="sparse")


def test_whisper_encoder_checks_before_every_block(whisper):
    calls = []
    whisper.transcribe(CLIP.read_bytes(), check=lambda: calls.append(1))
    assert len(calls) == whisper.cfg.n_enc_layers

    def cancel():
        calls.append(1)
        if len(calls) > 2:
            raise jobs.JobCancelled("the transcription was cancelled")
    calls.clear()
    with pytest.raises(jobs.JobCancelled):
        whisper.transcribe(CLIP.read_bytes(), check=cancel)
    assert len(calls) == 3                                            # stopped inside the encoder


def test_whisper_encoder_stops_at_the_time_limit_with_a_message(whisper, set_limits):
    set_limits(max_transcribe_seconds=0.0)
    with pytest.raises(jobs.JobTimeout, match="time limit"):   # a ValueError: the page shows its message
        whisper.transcribe(CLIP.read_bytes())


def test_translator_deadline_still_keeps_the_first_token(translator, set_limits):
    set_limits(max_translate_seconds=0.0)
    late = translator.translate(SENTENCE)
    assert late.n_tgt == 1 and late.stopped == "deadline"



def test_encoder_keys_and_values_are_computed_once_per_input(whisper, heard, translator, monkeypatch):
    """Whisper's word timing and a beam's teacher-forced pass reuse the decoding's encoder K/V
    (`DecoderState.fresh`) instead of projecting the encoder output again: one `start` a call, and
    the same words as a word timing that projects its own."""
    masks = dict(whisper._masks(None, None, None), vocab=None)
    with torch.inference_mode():
        memory, _ = whisper.encode_audio(heard.features, masks)
        own = whisper._words(memory, masks, heard.ids.tolist(), heard.audio_frames)
    for model, run in ((whisper, lambda: whisper.transcribe(CLIP.read_bytes())),
                       (translator, lambda: translator.translate(SENTENCE, beam=3))):
        calls, real = [], model.net.start
        monkeypatch.setattr(model.net, "start", lambda *a, **k: calls.append(1) or real(*a, **k))
        out = run()
        monkeypatch.undo()
        assert len(calls) == 1
    assert out.stopped == "eos" and out.n_tgt > 3
    shared = whisper.transcribe(CLIP.read_bytes()).words
    # transcribe moves the last word's end on to where its sound ends; the rest are the timing's own
    assert shared and shared[:-1] == own[:-1] and len(shared) == len(own)
    last, mine = shared[-1], own[-1]
    assert (last.text, last.start, last.tokens) == (mine.text, mine.start, mine.tokens) and last.end >= mine.end
