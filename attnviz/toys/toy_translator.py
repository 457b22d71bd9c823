"""A toy translator whose alignment is known exactly: an SVO language into an SOV language with
particles, "cat sees red fish" -> "cat ga red fish wo sees", learned by a small encoder-decoder of
`attnviz.core.seq2seq` (Marian layout: post-norm, self- and cross-attention in the decoder).

Every target word but the particles copies one source word, so the right alignment of each target
position is known: subject 0 -> 0, adjective 2 -> 2, object 3 -> 3, verb 5 -> 1 (the verb moves to
the end: its line crosses the others). `alignment_hits` reports how often each layer's (and each
head's) cross-attention peak falls on that source word.
"""
from __future__ import annotations

import itertools
import json
import time
from dataclasses import asdict
from importlib.resources import files

import torch
import torch.nn.functional as F

from attnviz.core.seq2seq import Seq2Seq, Seq2SeqConfig
from attnviz.core.translator import Seq2SeqModel

SUBJECTS = ("cat", "dog", "bird", "girl", "boy", "man", "woman", "child")
VERBS = ("sees", "likes", "chases", "helps", "finds", "calls")
ADJECTIVES = ("red", "big", "old", "small", "green", "happy")
OBJECTS = ("fish", "ball", "tree", "book", "car", "apple", "house", "cake")
PARTICLES = ("ga", "wo")          # subject and object markers of the SOV side
SPECIALS = ("</s>", "<pad>", "<unk>")
WORDS = SPECIALS + SUBJECTS + VERBS + ADJECTIVES + OBJECTS + PARTICLES
EOS, PAD = 0, 1
ALIGNED = {0: 0, 2: 2, 3: 3, 5: 1}  # target position -> source position (particles have none)
HELD_OUT = 0.2                      # share of all 2,304 sentences never trained on (scored on)
FOLDER = files("attnviz") / "data" / "toys" / "translate"
KEY = "toy-translate"


def vocabulary() -> dict[str, int]:
    return {w: i for i, w in enumerate(WORDS)}


def tokenizer():
    """A word-level tokenizer over WORDS (the `tokenizers` library, built in memory)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    tok = Tokenizer(models.WordLevel(vocabulary(), unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##")  # joins words with spaces
    return tok


def sentences() -> list[tuple[str, str]]:
    """Every (SVO, SOV) pair, in a fixed order."""
    return [(f"{s} {v} {a} {o}", f"{s} ga {a} {o} wo {v}")
            for s, v, a, o in itertools.product(SUBJECTS, VERBS, ADJECTIVES, OBJECTS)]


def split(seed: int = 0) -> tuple[list, list]:
    pairs = sentences()
    order = torch.randperm(len(pairs), generator=torch.Generator().manual_seed(seed)).tolist()
    cut = int(len(pairs) * (1 - HELD_OUT))
    return [pairs[i] for i in order[:cut]], [pairs[i] for i in order[cut:]]


def ids(text: str) -> list[int]:
    v = vocabulary()
    return [v[w] for w in text.split()] + [EOS]


def config(d_model: int = 32, n_heads: int = 4, layers: int = 2) -> Seq2SeqConfig:
    return Seq2SeqConfig(family="marian", n_enc_layers=layers, n_dec_layers=layers, n_heads=n_heads,
                         d_model=d_model, d_ff=2 * d_model, vocab_size=len(WORDS), positional="hf_marian",
                         embed_scale=d_model ** 0.5, decoder_start_id=PAD, eos_id=EOS, pad_id=PAD,
                         max_positions=16)


def train(steps: int = 600, batch: int = 64, lr: float = 3e-3, seed: int = 0, cfg=None) -> tuple[Seq2Seq, dict]:
    """Teacher-forced cross-entropy on the training split (all sentences have the same length)."""
    torch.manual_seed(seed)
    cfg = cfg or config()
    net = Seq2Seq(cfg).train()
    pairs, _ = split(seed)
    src = torch.tensor([ids(s) for s, _ in pairs])                     # (N, 5)
    tgt = torch.tensor([ids(t) for _, t in pairs])                     # (N, 7)
    feed = torch.cat([torch.full((len(tgt), 1), cfg.decoder_start_id), tgt[:, :-1]], dim=1)
    opt = torch.optim.Adam(net.parameters(), lr=lr)
    g = torch.Generator().manual_seed(seed)
    start, loss = time.perf_counter(), torch.tensor(0.0)
    for _ in range(steps):
        pick = torch.randint(0, len(src), (batch,), generator=g)
        memory, _ = net.encode(src[pick])
        logits = net.step(feed[pick], net.start(memory)).logits
        loss = F.cross_entropy(logits.reshape(-1, cfg.vocab_size), tgt[pick].reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
    return net.eval(), dict(steps=steps, batch=batch, lr=lr, seed=seed, final_loss=float(loss.detach()),
                            train_seconds=round(time.perf_counter() - start, 1))


def model_of(net: Seq2Seq) -> Seq2SeqModel:
    return Seq2SeqModel.build(net.cfg, net.state_dict(), KEY, "toy SVO -> SOV translator (shipped safetensors)",
                              tokenizer())


def alignment_hits(model: Seq2SeqModel, pairs: list[tuple[str, str]]) -> dict:
    """Share of aligned target positions whose cross-attention peak is the aligned source word:
    per layer (head-averaged) [L] and per head [L, H]; plus exact-match accuracy of greedy output."""
    cfg = model.cfg
    layer_hits = torch.zeros(cfg.n_dec_layers)
    head_hits = torch.zeros(cfg.n_dec_layers, cfg.n_heads)
    exact = 0
    for source, target in pairs:
        tr = model.trace(source, target=target)
        att = tr.cross_attentions                                     # [L, H, 7, 5]
        for t, s in ALIGNED.items():
            layer_hits += (att[:, :, t].mean(1).argmax(-1) == s).float()
            head_hits += (att[:, :, t].argmax(-1) == s).float()
        exact += model.translate(source, attentions=False).text == target
    n = len(pairs) * len(ALIGNED)
    return dict(layers=(layer_hits / n).tolist(), heads=(head_hits / n).tolist(), exact=exact / len(pairs),
                n_sentences=len(pairs))


def save(net: Seq2Seq, meta: dict, folder=None):
    from safetensors.torch import save_file
    folder = folder or FOLDER
    state = {k: v.contiguous() for k, v in net.state_dict().items() if k != "lm_head.weight"}  # tied
    save_file(state, str(folder / f"{KEY}.safetensors"))
    (folder / f"{KEY}.json").write_text(json.dumps(dict(meta, config=asdict(net.cfg)), indent=1))


def load() -> tuple[Seq2SeqModel, dict]:
    """The shipped toy translator and what was measured when it was trained."""
    from safetensors.torch import load
    meta = json.loads((FOLDER / f"{KEY}.json").read_text())
    state = load((FOLDER / f"{KEY}.safetensors").read_bytes())
    return Seq2SeqModel.build(Seq2SeqConfig(**meta["config"]), state, KEY,
                              "toy SVO -> SOV translator (shipped safetensors)", tokenizer()), meta


def main():
    """`python -m attnviz.toys.toy_translator`: train, score on the held-out split, ship."""
    net, meta = train()
    _, held_out = split(meta["seed"])
    meta["alignment"] = alignment_hits(model_of(net), held_out)
    FOLDER.mkdir(parents=True, exist_ok=True)
    save(net, dict(meta, key=KEY, description="SVO -> SOV with particles; the alignment is known exactly"))
    return meta


if __name__ == "__main__":
    main()
