"""A small model, trained here in the Lab, that reads a short digit string off a picture: text
attending to an image. No installable package ships the weights of a pretrained OCR or captioning
decoder (they are all fetched from a hub at run time), so this one is trained from scratch in
seconds and is labelled as such wherever it is shown.

The pictures are drawn with Pillow's bundled font (deterministic: the same string, layout and
seed give the same pixels everywhere), cut into PATCH x PATCH patches. The image encoder is a
patch embedding plus learned 2-D (row + column) positions and the core self-attention `Block`s;
the text decoder is the encoder-decoders' `CrossBlock`: causal self-attention over the digits read
so far, then cross-attention whose queries are projected from the text tokens (`cross.q`) and
whose keys and values from the image patches (`cross.kv`): separate projections per modality.
Both sides run through the one block runner (`Seq2Seq.encode` / `step`, i.e.
`attnviz.core.blocks.iter_layers`); head masks are call arguments.
"""
from __future__ import annotations

import functools
import zlib
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch
import torch.nn as nn
from PIL import Image, ImageDraw, ImageFont

from attnviz.core.seq2seq import Seq2Seq, Seq2SeqConfig

DIGITS = "0123456789"
EOS, BOS = 10, 11
VOCAB = tuple(DIGITS) + ("</s>", "<s>")
HEIGHT, WIDTH, PATCH = 16, 64, 8          # a 2 x 8 grid of 8 x 8-pixel patches
GRID = (HEIGHT // PATCH, WIDTH // PATCH)
MIN_DIGITS, MAX_DIGITS = 1, 5
FONT_SIZE, ADVANCE = 14, 8                # every digit of Pillow's font at 14 px advances 8 px
GLYPH_W = 10                              # and inks at most 9 columns
MAX_JITTER = 2
HELD_OUT_EVERY = 5                        # strings whose CRC-32 is a multiple of 5 are never trained on


def font() -> ImageFont.ImageFont:
    """Pillow's bundled font (the same file in every Pillow wheel, so the same pixels everywhere)."""
    return ImageFont.load_default(size=FONT_SIZE)


def check_text(text: str) -> str:
    text = str(text).strip()
    if not MIN_DIGITS <= len(text) <= MAX_DIGITS or any(ch not in DIGITS for ch in text):
        raise ValueError(f"the reader reads {MIN_DIGITS} to {MAX_DIGITS} digits (0-9); got {text[:20]!r}")
    return text


def is_held_out(text: str) -> bool:
    """Whether `text` belongs to the held-out strings (never drawn for training)."""
    return zlib.crc32(text.encode()) % HELD_OUT_EVERY == 0


@dataclass(frozen=True)
class Drawn:
    text: str
    pixels_u8: np.ndarray                 # (HEIGHT, WIDTH) uint8, white digits on black
    spans: tuple[tuple[int, int], ...]    # each digit's pixel columns [x0, x1)

    @property
    def image(self) -> Image.Image:
        return Image.fromarray(self.pixels_u8, mode="L")

    def pixels(self) -> torch.Tensor:
        return torch.from_numpy(self.pixels_u8.astype(np.float32) / 255.0)    # (H, W)

    def patch_columns(self, index: int) -> list[int]:
        """The patch columns that digit `index`'s ADVANCE-pixel span touches (one or two)."""
        x0, x1 = self.spans[index]
        return [c for c in range(GRID[1]) if min(x1, (c + 1) * PATCH) > max(x0, c * PATCH)]


@functools.lru_cache(maxsize=4 * len(DIGITS))
def glyph(ch: str, dy: int) -> np.ndarray:
    """Pillow's rendering of one digit, shifted down by `dy`, on a HEIGHT x GLYPH_W tile (drawn once)."""
    tile = Image.new("L", (GLYPH_W, HEIGHT), 0)
    ImageDraw.Draw(tile).text((0, dy - 3), ch, fill=255, font=font())
    out = np.asarray(tile)
    out.flags.writeable = False
    return out


def draw(text: str, x: int | None = None, gap: int = 1, dy: int = 1) -> Drawn:
    """The picture of `text`: each digit as Pillow draws it, ADVANCE + `gap` pixels apart from
    column `x` (the training pictures' start, 1, when None), shifted down by `dy` (0-3); where
    glyphs touch, the brighter wins."""
    text = check_text(text)
    width = len(text) * ADVANCE + (len(text) - 1) * gap
    if not 0 <= gap <= 3 or not 0 <= dy <= 3:
        raise ValueError("gap and dy lie in 0..3")
    x = 1 if x is None else int(x)
    if not 0 <= x <= WIDTH - width:
        raise ValueError(f"{len(text)} digits drawn from column {x} do not fit {WIDTH} pixels")
    canvas = np.zeros((HEIGHT, WIDTH + GLYPH_W), np.uint8)
    spans = []
    for i, ch in enumerate(text):
        left = x + i * (ADVANCE + gap)
        np.maximum(canvas[:, left:left + GLYPH_W], glyph(ch, dy), out=canvas[:, left:left + GLYPH_W])
        spans.append((left, left + ADVANCE))
    return Drawn(text, np.ascontiguousarray(canvas[:, :WIDTH]), tuple(spans))


def random_drawing(generator: torch.Generator, held_out: bool = False) -> Drawn:
    """A random string of the training (or held-out) strings, left-aligned as a line of text is,
    its start, spacing and height each jittered by 0..MAX_JITTER pixels. (Strings placed anywhere
    on the line were learned too slowly for the Lab's minute: 4 % exact after 1,000 steps.)"""
    while True:
        n = int(torch.randint(MIN_DIGITS, MAX_DIGITS + 1, (1,), generator=generator))
        text = "".join(DIGITS[i] for i in torch.randint(0, 10, (n,), generator=generator).tolist())
        if is_held_out(text) == held_out:
            break
    gap, dy, x = torch.randint(0, MAX_JITTER + 1, (3,), generator=generator).tolist()
    return draw(text, x, gap, dy)


def patches(pixels: torch.Tensor) -> torch.Tensor:
    """(B, H, W) -> (B, S, PATCH * PATCH), patches row by row (patch s = row s // 16, column s % 16)."""
    B = pixels.shape[0]
    p = pixels.reshape(B, GRID[0], PATCH, GRID[1], PATCH).permute(0, 1, 3, 2, 4)
    return p.reshape(B, GRID[0] * GRID[1], PATCH * PATCH)


def batch(drawings: list[Drawn]):
    """-> patches (B, S, P*P), decoder input (B, T) from <s>, targets (B, T) (-100 past </s>)."""
    T = max(len(d.text) for d in drawings) + 1
    feed = np.full((len(drawings), T), EOS)
    target = np.full((len(drawings), T), -100)
    for i, d in enumerate(drawings):
        ids = [DIGITS.index(ch) for ch in d.text]
        feed[i, :len(ids) + 1] = [BOS] + ids
        target[i, :len(ids) + 1] = ids + [EOS]
    pixels = torch.from_numpy(np.stack([d.pixels_u8 for d in drawings]).astype(np.float32) / 255.0)
    return patches(pixels), torch.from_numpy(feed), torch.from_numpy(target)


@dataclass(frozen=True)
class ReaderConfig(Seq2SeqConfig):
    grid_h: int = GRID[0]
    grid_w: int = GRID[1]
    patch: int = PATCH

    @property
    def task(self) -> str:
        return "reading"


def reader_config(d_model: int = 32, n_heads: int = 4, enc_layers: int = 2, dec_layers: int = 2) -> ReaderConfig:
    return ReaderConfig(family="image-reader", n_enc_layers=enc_layers, n_dec_layers=dec_layers, n_heads=n_heads,
                        d_model=d_model, d_ff=2 * d_model, vocab_size=len(VOCAB), decoder="attention",
                        activation="gelu", positional="hf_marian", decoder_start_id=BOS, eos_id=EOS,
                        pad_id=EOS, max_positions=MAX_DIGITS + 2, pre_norm=True)


class ImageReader(Seq2Seq):
    """`Seq2Seq` whose encoder reads image patches: `encode(patches (B, S, P*P))`."""

    def __init__(self, cfg: ReaderConfig):
        super().__init__(cfg)
        d = cfg.d_model
        self.patch_embed = nn.Linear(cfg.patch * cfg.patch, d)
        self.row_pos = nn.Parameter(torch.randn(cfg.grid_h, 1, d) * 0.5)
        self.col_pos = nn.Parameter(torch.randn(1, cfg.grid_w, d) * 0.5)

    def embed(self, x, start: int, side: str):
        if side != "enc":
            return super().embed(x, start, side)
        cfg = self.cfg
        if x.dim() != 3 or x.shape[1:] != (cfg.grid_h * cfg.grid_w, cfg.patch * cfg.patch):
            raise ValueError(f"the reader reads [{cfg.grid_h * cfg.grid_w}, {cfg.patch ** 2}] patches; "
                             f"got {list(x.shape[1:])}")
        return self.patch_embed(x) + (self.row_pos + self.col_pos).reshape(-1, cfg.d_model)


def new_reader(cfg: ReaderConfig | None = None, seed: int = 0) -> ImageReader:
    torch.manual_seed(seed)
    return ImageReader(cfg or reader_config())


@dataclass
class Reading:
    """One picture read greedily, and what each step read."""
    drawn: Drawn
    text: str                       # what the model read (up to </s>)
    tokens: list[str]               # one per step, "</s>" included when reached
    logprobs: list[float]
    cross: torch.Tensor             # [L_dec, H, n_steps, S] cross-attention; rows sum to 1
    queries: list[torch.Tensor]     # per layer (H, n_steps, d_head): the text side's queries
    keys: list[torch.Tensor]        # per layer (H, S, d_head): the image side's keys

    @property
    def correct(self) -> bool:
        return self.text == self.drawn.text

    def patch_map(self, step: int, layer: int, head: int | None = None) -> torch.Tensor:
        """[grid_h, grid_w] attention of step `step` (one head, or the heads' mean)."""
        att = self.cross[layer, :, step] if head is None else self.cross[layer, head, step][None]
        return att.mean(0).reshape(GRID)

    def share_on_digit(self, step: int, layer: int, head: int | None = None, digit: int | None = None) -> float:
        """Share of that attention on the patch columns of digit `digit` of the picture (default:
        the digit at this step's position)."""
        digit = step if digit is None else digit
        if not 0 <= digit < len(self.drawn.text):
            raise ValueError(f"the picture has {len(self.drawn.text)} digits; no digit {digit}")
        return float(self.patch_map(step, layer, head)[:, self.drawn.patch_columns(digit)].sum())


def read(net: ImageReader, drawn: Drawn | str, head_mask=None, check: Callable[[], None] | None = None) -> Reading:
    """Read one picture greedily (at most MAX_DIGITS digits and </s>); `head_mask` [L_dec, H]
    (1 keeps a head) applies to the cross-attention. `check()` runs before every block."""
    drawn = draw(drawn) if isinstance(drawn, str) else drawn
    L = len(net.decoder)
    seen: dict[int, list[torch.Tensor]] = {j: [] for j in range(L)}

    def grab(layer):  # records the cross-attention's queries, changes nothing
        def patch(name, t):
            if name == "q":
                seen[layer].append(t[0, :, -1])          # (H, d_head)
            return t
        return patch

    with torch.inference_mode():
        memory, _ = net.encode(patches(drawn.pixels()[None]), check=check)
        state = net.start(memory)
        keys = [layer["memory"][0][0] for layer in state.layers]
        feed, ids, logprobs, rows = torch.tensor([[BOS]]), [], [], []
        for _ in range(MAX_DIGITS + 1):
            if check is not None:
                check()
            out = net.step(feed, state, head_mask=head_mask, need_weights=True,
                           patch={j: grab(j) for j in range(L)})
            logp = torch.log_softmax(out.logits[0, -1].float(), -1)
            nxt = int(logp.argmax())
            ids.append(nxt)
            logprobs.append(float(logp[nxt]))
            rows.append(torch.stack([out.cross[j][0, :, -1] for j in range(L)]))
            if nxt == EOS:
                break
            feed = torch.tensor([[nxt]])
    digits = ids[:ids.index(EOS)] if EOS in ids else ids
    return Reading(drawn, "".join(VOCAB[i] for i in digits), [VOCAB[i] for i in ids], logprobs,
                   torch.stack(rows, dim=2), [torch.stack(seen[j], 1) for j in range(L)], keys)


def greedy_texts(net: ImageReader, drawings: list[Drawn], head_mask=None) -> list[str]:
    """What the reader reads on each picture, all at once (greedy, at most MAX_DIGITS digits)."""
    with torch.inference_mode():
        memory, _ = net.encode(batch(drawings)[0])
        state = net.start(memory)
        feed = torch.full((len(drawings), 1), BOS)
        out_ids = []
        for _ in range(MAX_DIGITS + 1):
            nxt = net.step(feed, state, head_mask=head_mask).logits[:, -1].argmax(-1)
            out_ids.append(nxt)
            feed = nxt[:, None]
    texts = []
    for row in torch.stack(out_ids, 1).tolist():
        row = row[:row.index(EOS)] if EOS in row else row
        texts.append("".join(VOCAB[i] if i < 10 else "?" for i in row))
    return texts


def held_out_set(n: int = 500, seed: int = 1234) -> list[Drawn]:
    """`n` held-out pictures (strings never trained on), always the same for a seed."""
    g = torch.Generator().manual_seed(seed)
    return [random_drawing(g, held_out=True) for _ in range(n)]


def exact_accuracy(net: ImageReader, drawings: list[Drawn] | None = None, head_mask=None) -> float:
    """Share of pictures read exactly (every digit, nothing more)."""
    drawings = held_out_set() if drawings is None else drawings
    texts = greedy_texts(net, drawings, head_mask)
    return sum(t == d.text for t, d in zip(texts, drawings)) / len(drawings)
