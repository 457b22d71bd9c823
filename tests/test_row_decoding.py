"""Greedy decoding's one-row path (the block runner's `row=True`): the same numbers as the generic
step, its derived weight layout built once per model and rebuilt when a weight changes, the
after-loop scoring equal to a full log-softmax, and the shared model never changed by a decoding."""
from __future__ import annotations

import hashlib

import pytest
import torch

import attnviz
from attnviz.core import decoding
from attnviz.core.seq2seq import Seq2Seq, Seq2SeqConfig

SENTENCES = {"en-pt": "The meeting starts at 9:30 tomorrow morning.",
             "pt-en": "O gato está dormindo na cama."}


@pytest.fixture(scope="module", params=sorted(SENTENCES))
def bundled(request):
    return request.param, attnviz.load_model(request.param)


def checksum(net: torch.nn.Module) -> str:
    """Every parameter and buffer, bytes and names, in order."""
    h = hashlib.sha256()
    for name, t in list(net.named_parameters()) + list(net.named_buffers()):
        h.update(name.encode())
        h.update(t.detach().contiguous().numpy().tobytes())
    return h.hexdigest()


def steps_both_ways(net, memory, tokens, head_mask=None):
    """Each token fed through the one-row path and through the generic step: both outputs per step."""
    rows, generic = net.row_state(memory), net.start(memory)
    assert rows is not None
    out = []
    for t, token in enumerate(tokens):
        fed = torch.tensor([[token]])
        x = net.embed_row(token, t)
        assert torch.equal(x, net.embed(fed, t, "dec")[0])   # the same embedding, to the bit
        row = net.step_row(x, rows, head_mask=head_mask)
        step = net.step(fed, generic, head_mask=head_mask, logits=False).logits[0]
        out.append((row, step))
    return out


def test_the_row_path_is_the_generic_step_on_the_bundled_models(bundled):
    key, model = bundled
    tr = model.translate(SENTENCES[key])
    net, tokens = model.net, [model.cfg.decoder_start_id] + tr.target_ids.tolist()[:-1]
    mask = torch.ones(2, 8)
    mask[1, 3] = 0
    with torch.inference_mode():
        memory, _ = net.encode(tr.source_ids[None])
        for head_mask in (None, mask):
            for row, step in steps_both_ways(net, memory, tokens, head_mask):
                # hidden states (LayerNorm outputs, up to ~5): products in another order, float rounding
                torch.testing.assert_close(row, step, atol=3e-5, rtol=1e-5)
    # the whole translation, the row path against recomputing every prefix through the generic step
    full = model.translate(SENTENCES[key], cache=False)
    assert torch.equal(tr.target_ids, full.target_ids) and torch.equal(tr.top_ids, full.top_ids)
    torch.testing.assert_close(tr.cross_attentions, full.cross_attentions, atol=1e-5, rtol=0)
    torch.testing.assert_close(tr.logprobs, full.logprobs, atol=1e-4, rtol=0)


def test_the_encoder_keys_and_values_laid_out_two_ways_agree(bundled):
    """Projected straight into the row layout, or computed by `start` and laid out again (a state
    shared by several decodings): the same K^T and V up to float rounding, the same weights."""
    key, model = bundled
    net = model.net
    with torch.inference_mode():
        memory, _ = net.encode(model.source(SENTENCES[key])[0][None])
        direct, again = net.row_state(memory), net.row_state(memory, net.start(memory))
    for a, b in zip(direct.layers, again.layers):
        assert a["kT"].shape == b["kT"].shape and a["vr"].shape == b["vr"].shape
        torch.testing.assert_close(a["kT"], b["kT"], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(a["vr"], b["vr"], atol=1e-5, rtol=1e-5)
        assert all(x is y for x, y in zip(a["row"][:-2], b["row"][:-2]))   # one weight layout per model
    padded = net.start(memory, allowed=torch.ones(1, 1, 1, memory.shape[1], dtype=torch.bool))
    assert net.row_state(memory, padded) is None and net.row_state(torch.cat([memory, memory])) is None


def test_decoding_leaves_the_shared_model_unchanged(bundled):
    key, model = bundled
    before, fingerprint = checksum(model.net), model.fingerprint()
    model.translate(SENTENCES[key])
    model.translate(SENTENCES[key], shortlist=True)
    model.translate(SENTENCES[key], head_mask=torch.zeros(2, 8), attentions=False)
    assert checksum(model.net) == before and model.fingerprint() == fingerprint


def small_net() -> Seq2Seq:
    torch.manual_seed(0)
    cfg = Seq2SeqConfig(family="bergamot", n_enc_layers=1, n_dec_layers=2, n_heads=2, d_model=16, d_ff=32,
                        vocab_size=40, decoder="ssru", zero_start=True, embed_scale=4.0, max_positions=8)
    return Seq2Seq(cfg).eval()


def test_the_row_layout_is_built_once_and_rebuilt_when_a_weight_changes():
    net = small_net()
    block = net.decoder[0]
    first = block.row_weights()
    assert block.row_weights() is first                               # cached: built once
    query = first[4]                                                  # random weights: no int8 grid, float32
    assert not query.on_grid and torch.equal(query.weight, block.cross.q.weight.t())   # transposed
    assert query.weight.is_contiguous() and query.weight.data_ptr() != block.cross.q.weight.data_ptr()
    with torch.no_grad():
        block.cross.q.weight.mul_(2)                                   # training, a loaded state
    again = block.row_weights()
    assert again is not first and torch.equal(again[4].weight, block.cross.q.weight.t())


def test_the_row_path_on_a_small_model_past_the_position_table():
    """Positions beyond the table (computed, not looked up) and the zero start, both ways."""
    net = small_net()
    with torch.inference_mode():
        memory, _ = net.encode(torch.tensor([[3, 5, 7, 0]]))
        for row, step in steps_both_ways(net, memory, [0, 4, 9, 2, 11, 6, 1, 8, 3, 5]):
            torch.testing.assert_close(row, step, atol=1e-6, rtol=0)


@pytest.mark.parametrize("width", [250, 32000, 1000])
def test_the_scoring_equals_a_full_log_softmax(width):
    """Log-probabilities of the chosen columns and the top candidates, as a log-softmax over every
    column followed by topk gives them."""
    torch.manual_seed(1)
    logits = torch.randn(7, width) * 4
    cols = logits.argmax(-1)
    chosen, top_v, top_i = decoding.summarise(logits, cols, decoding.TOP_K)
    logp = torch.log_softmax(logits, -1)
    ref = logp.topk(decoding.TOP_K, dim=-1)
    assert torch.equal(top_i, ref.indices)
    torch.testing.assert_close(top_v, ref.values, atol=1e-5, rtol=0)
    torch.testing.assert_close(chosen, logp.gather(1, cols[:, None])[:, 0], atol=1e-5, rtol=0)
    # the logits' block maxima, found once for the argmax, pick the same blocks of log-probabilities
    maxima = decoding.block_maxima(logits)
    assert (maxima is None) == (width < 8 * decoding.BLOCK)
    again = decoding.summarise(logits, cols, decoding.TOP_K, maxima)
    assert all(torch.equal(a, b) for a, b in zip(again, (chosen, top_v, top_i)))
    assert torch.equal(decoding.row_argmax(logits, maxima), cols)


def test_the_blockwise_argmax_is_argmax():
    torch.manual_seed(2)
    logits = torch.randn(9, 32000)
    logits[3, 5000] = logits[3, 70] = 50.0      # equal maxima: the first, as argmax gives it
    assert torch.equal(decoding.row_argmax(logits), logits.argmax(-1))
    assert int(decoding.row_argmax(logits)[3]) == 70
    assert torch.equal(decoding.row_argmax(logits[:, :250]), logits[:, :250].argmax(-1))
