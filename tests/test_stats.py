"""Head statistics, roles, rollout and distances on synthetic patterns with known answers."""

import math

import pytest
import torch

from attnviz.analysis.stats import ROLES, STAT_COLUMNS, attention_received, downsample_attention, head_stats, is_causal, mean_attention_distance, patch_grid_coords, rollout, rollout_per_layer, to_patch_grid, token_flow

N = 8


def previous_token(n=N, first_row_key=0):
    """Every query i > 0 puts all weight on i-1; row 0 goes to `first_row_key`."""
    pattern = torch.zeros(n, n)
    pattern[0, first_row_key] = 1.0
    pattern[torch.arange(1, n), torch.arange(n - 1)] = 1.0
    return pattern


def all_on_first(n=N):
    pattern = torch.zeros(n, n)
    pattern[:, 0] = 1.0
    return pattern


def causal_uniform(n=N):
    pattern = torch.ones(n, n).tril()
    return pattern / pattern.sum(-1, keepdim=True)


def stats_of(*patterns, **kwargs):
    return head_stats(torch.stack(patterns)[None], **kwargs)   # (1, H, n, n)


def test_previous_token_head_in_a_decoder():
    row = stats_of(previous_token(), causal_uniform()).iloc[0]   # both causal: guessed causal
    assert row["role"] == "previous-token"
    assert row["prev_share"] == pytest.approx(1.0)
    assert row["mean_distance"] == pytest.approx(1.0)   # row 0 has no choice and is left out
    assert row["collapsed"] and not row["uniform"]
    assert row["entropy"] == pytest.approx(0.0, abs=1e-6)


def test_previous_token_head_in_an_encoder():
    # Row 0 sends its weight to token 1 (distance 1 too), so the encoder mean is exactly 1.
    stats = stats_of(previous_token(first_row_key=1), torch.ones(N, N) / N)
    assert stats.loc[0, "role"] == "previous-token"
    assert stats.loc[0, "prev_share"] == pytest.approx(1.0)
    assert stats.loc[0, "mean_distance"] == pytest.approx(1.0)
    assert mean_attention_distance(torch.stack([previous_token(first_row_key=1)])[None],
                                            causal=False)[0, 0] == pytest.approx(1.0)


def test_identity_is_self_and_sink_is_sink():
    stats = stats_of(torch.eye(N), all_on_first(), torch.ones(N, N) / N)
    assert list(stats["role"][:2]) == ["self", "sink"]
    assert stats.loc[0, "self_share"] == pytest.approx(1.0)
    assert stats.loc[1, "first_share"] == pytest.approx(1.0)
    assert stats.loc[0, "collapsed"] and stats.loc[1, "collapsed"]
    assert math.isnan(stats.loc[0, "special_share"])   # no special mask given


def test_special_share_counts_marked_tokens():
    pattern = torch.zeros(N, N)
    pattern[:, -1] = 1.0                               # everything on the final [SEP]
    special = torch.zeros(N, dtype=torch.bool)
    special[[0, -1]] = True
    row = stats_of(pattern, torch.ones(N, N) / N, special=special).iloc[0]
    assert row["special_share"] == pytest.approx(1.0)
    assert row["first_share"] == pytest.approx(0.0)
    assert row["role"] == "sink"


def test_uniform_encoder_head():
    row = stats_of(torch.ones(N, N) / N).iloc[0]
    assert row["uniform"] and not row["collapsed"]
    assert row["norm_entropy"] == pytest.approx(1.0, abs=1e-6)
    assert row["entropy"] == pytest.approx(math.log(N), abs=1e-5)
    assert row["role"] == "broad"


def test_causal_uniform_head_has_normalised_entropy_one():
    row = stats_of(causal_uniform()).iloc[0]
    assert is_causal(causal_uniform()[None, None])
    assert row["norm_entropy"] == pytest.approx(1.0, abs=1e-6)
    assert row["uniform"]
    # Without causal handling the same head would look far from uniform.
    assert stats_of(causal_uniform(), causal=False).iloc[0]["norm_entropy"] < 0.9


def test_local_and_long_range_roles():
    n = 32
    window = torch.zeros(n, n)                       # +-1 window, no key holds a majority
    for i in range(n):
        keys = [j for j in (i - 1, i, i + 1) if 0 <= j < n]
        window[i, keys] = 1.0 / len(keys)
    far = torch.zeros(n, n)                          # each query looks at the opposite end
    far[torch.arange(n), torch.arange(n).flip(0)] = 0.4
    far[torch.arange(n), (torch.arange(n).flip(0) + 1) % n] += 0.3
    far[torch.arange(n), (torch.arange(n).flip(0) - 1) % n] += 0.3
    stats = head_stats(torch.stack([window, far])[None], causal=False)
    assert list(stats["role"]) == ["local", "long-range"]
    assert set(stats["role"]) <= set(ROLES)


def test_stats_table_shape_and_columns():
    attn = torch.softmax(torch.randn(3, 4, 5, 5, generator=torch.Generator().manual_seed(0)), -1)
    stats = head_stats(attn)
    assert list(stats.columns) == list(STAT_COLUMNS)
    assert len(stats) == 12
    assert list(stats["layer"]) == [0] * 4 + [1] * 4 + [2] * 4
    assert stats["norm_entropy"].between(0, 1 + 1e-6).all()


def test_rollout_of_identity_is_identity():
    attn = torch.eye(N).expand(4, 3, N, N)
    torch.testing.assert_close(rollout(attn), torch.eye(N))
    torch.testing.assert_close(rollout(attn, residual=False), torch.eye(N))


def test_rollout_rows_sum_to_one_and_match_a_hand_computation():
    gen = torch.Generator().manual_seed(1)
    attn = torch.softmax(torch.randn(3, 2, 6, 6, generator=gen), -1)
    per_layer = rollout_per_layer(attn)
    assert per_layer.shape == (3, 6, 6)
    torch.testing.assert_close(per_layer.sum(-1), torch.ones(3, 6))
    mixed = [0.5 * attn[layer].mean(0) + 0.5 * torch.eye(6) for layer in range(3)]
    torch.testing.assert_close(per_layer[-1], mixed[2] @ mixed[1] @ mixed[0])
    torch.testing.assert_close(rollout(attn), per_layer[-1])


def test_rollout_head_mask_averages_only_kept_heads():
    attn = torch.stack([torch.eye(N), all_on_first()])[None]          # (1, 2, n, n)
    keep_identity = torch.tensor([[1.0, 0.0]])
    torch.testing.assert_close(rollout(attn, residual=False, head_mask=keep_identity),
                               torch.eye(N))
    # Every head removed: the layer passes the residual stream through unchanged.
    torch.testing.assert_close(rollout(attn, head_mask=torch.zeros(1, 2)), torch.eye(N))
    with pytest.raises(ValueError, match="head_mask"):
        rollout(attn, head_mask=torch.ones(2, 2))


def test_token_flow_and_received_attention():
    attn = torch.stack([torch.eye(N), all_on_first()])[None].expand(2, 2, N, N)
    flow = token_flow(attn, 3)
    expected = torch.zeros(N)
    expected[0], expected[3] = 0.5, 0.5
    torch.testing.assert_close(flow, expected.expand(2, N))
    torch.testing.assert_close(token_flow(attn, -1), token_flow(attn, N - 1))
    assert attention_received(attn).sum(-1).allclose(torch.ones(2))
    with pytest.raises(ValueError, match="out of range"):
        token_flow(attn, N)


def test_patch_distance_excludes_cls_and_uses_grid_coordinates():
    coords, mask = patch_grid_coords(3, 3, n_prefix=1)     # CLS + 9 patches
    n = 10
    pattern = torch.zeros(n, n)
    pattern[:, 0] = 0.5                                              # half the mass on CLS
    right_neighbour = [1 + 3 * (p // 3) + (p % 3 + 1) % 3 for p in range(9)]
    pattern[torch.arange(1, n), torch.tensor(right_neighbour)] += 0.5
    pattern[0, 0] = 1.0
    distance = mean_attention_distance(pattern[None, None], coords=coords, mask=mask)
    # Two of three patches in a row move by 1 column, the wrapping one by 2: mean 4/3.
    assert distance.shape == (1, 1)
    assert distance[0, 0] == pytest.approx(4 / 3, abs=1e-6)
    assert to_patch_grid(torch.arange(n), 1, (3, 3)).tolist() == [
        [1, 2, 3], [4, 5, 6], [7, 8, 9]]


def test_downsample_keeps_rows_distributions():
    gen = torch.Generator().manual_seed(2)
    attn = torch.softmax(torch.randn(2, 3, 50, 50, generator=gen), -1)
    pooled = downsample_attention(attn, 16)                  # block 4 -> 13, ragged end
    assert pooled.shape == (2, 3, 13, 13)
    torch.testing.assert_close(pooled.sum(-1), torch.ones(2, 3, 13))
    torch.testing.assert_close(pooled[..., 0, 0], attn[..., :4, :4].sum(-1).mean(-1))
    assert torch.equal(downsample_attention(attn, 64), attn)   # already small enough


@pytest.mark.parametrize("bad", [torch.ones(4, 4), torch.ones(1, 2, 3, 4), torch.ones(1, 1, 0, 0)])
def test_wrong_shapes_raise_clear_errors(bad):
    with pytest.raises(ValueError, match=r"\[layers, heads, n, n\]"):
        head_stats(bad)
    with pytest.raises(ValueError, match=r"\[layers, heads, n, n\]"):
        rollout(bad)


def test_special_mask_of_wrong_length_raises():
    with pytest.raises(ValueError, match="special"):
        head_stats(torch.eye(N)[None, None], special=torch.zeros(N + 1, dtype=torch.bool))


