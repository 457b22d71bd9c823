"""Find heads: every head ranked by how much more the query attends to the key than the other words
do, over token spans; a column head (every word looks at the key) is labelled so, never taken for a
link."""
import pytest
import torch

from attnviz.analysis.head_ranking import PATTERNS, RANK_COLUMNS, rank_heads, ranking_sentences


def causal_uniform(n: int) -> torch.Tensor:
    return torch.tril(torch.ones(n, n)) / torch.arange(1, n + 1)[:, None]


def test_rank_heads_orders_every_head_by_contrast_and_reads_the_tensor():
    gen = torch.Generator().manual_seed(3)
    attn = torch.softmax(torch.randn(3, 4, 6, 6, generator=gen), -1)
    attn[1, 2, 4] = torch.tensor([0.0, 0.9, 0.1, 0.0, 0.0, 0.0])   # the head that sends 4 -> 1
    table = rank_heads(attn, query=4, key=1, causal=False)
    assert list(table.columns) == list(RANK_COLUMNS)
    assert len(table) == 12 and set(zip(table["layer"], table["head"])) == {
        (la, h) for la in range(3) for h in range(4)}
    assert (table.loc[0, "layer"], table.loc[0, "head"]) == (1, 2)
    assert table.loc[0, "weight"] == pytest.approx(0.9) and table.loc[0, "key_rank"] == 1
    assert table["rank"].tolist() == list(range(1, 13))
    assert (table["contrast"].diff().dropna() <= 0).all()              # strongest first
    for layer, head, weight, others, contrast, key_rank in table[
            ["layer", "head", "weight", "others", "contrast", "key_rank"]].itertuples(index=False):
        row = attn[layer, head, 4]
        assert weight == pytest.approx(float(row[1]))
        assert others == pytest.approx(float(attn[layer, head, [0, 2, 3, 5], 1].mean()))
        assert contrast == pytest.approx(weight - others)
        assert key_rank == int((row > row[1]).sum()) + 1
    assert rank_heads(attn, query=-2, key=-5, causal=False).equals(table)     # same as (4, 1)
    by_weight = rank_heads(attn, 4, 1, causal=False, by="weight")
    assert (by_weight["weight"].diff().dropna() <= 0).all()


def test_a_column_head_ranks_below_a_link_and_is_labelled_so():
    """Head 0 sends every row to token 2 (0.8 from the query too); head 1 sends only the query
    there (0.6). By weight head 0 wins; by contrast head 1 does, and head 0 is a column head."""
    n = 6
    attn = torch.stack([causal_uniform(n)] * 3)[None].clone()            # (1, 3, 6, 6)
    for q in range(3, n):
        attn[0, 0, q] = 0.0
        attn[0, 0, q, 2], attn[0, 0, q, q] = 0.8, 0.2
    attn[0, 1, 5] = torch.tensor([0.1, 0.1, 0.6, 0.1, 0.05, 0.05])
    table = rank_heads(attn, 5, 2, causal=True)
    assert (table.loc[0, "head"], table.loc[0, "pattern"]) == (1, "link")
    column = table.set_index("head").loc[0]
    assert column["weight"] > table.loc[0, "weight"] and column["pattern"] == "column"
    assert abs(column["contrast"]) < 1e-6
    # the other queries are those that see the key: 3 and 4 (not 0, 1 before it, not the key)
    assert table.set_index("head").loc[1, "others"] == pytest.approx(float(attn[0, 1, [3, 4], 2].mean()))
    sentences = ranking_sentences(table, "它", "苹果")
    assert sentences[0].startswith("Layer 0, head 1 links “它” to “苹果”: it sends 0.60")
    assert "Layer 0, head 0 gives “苹果” more" in sentences[1] and PATTERNS["column"] in sentences[1]


def test_spans_sum_the_key_and_average_the_query():
    gen = torch.Generator().manual_seed(5)
    attn = torch.softmax(torch.randn(2, 2, 7, 7, generator=gen), -1)
    table = rank_heads(attn, [5, 6], [1, 2], causal=False, content=range(1, 7)).sort_values(["layer", "head"])
    first = table.iloc[0]
    assert first["weight"] == pytest.approx(float(attn[0, 0, [5, 6]][:, [1, 2]].sum(-1).mean()))
    assert first["others"] == pytest.approx(float(attn[0, 0, [3, 4]][:, [1, 2]].sum(-1).mean()))  # 0 is special
    row = attn[0, 0, [5, 6]].mean(0)
    assert first["key_rank"] == int((row[[0, 3, 4, 5, 6]] > row[[1, 2]].sum()).sum()) + 1


def test_a_start_token_key_is_a_sink_and_bad_input_is_refused():
    attn = torch.stack([causal_uniform(4)] * 2)[None].clone()
    attn[0, 0, :, :] = 0
    attn[0, 0, :, 0] = 1.0                                  # every row on the first token
    table = rank_heads(attn, 3, 0, causal=True)
    assert table.set_index("head").loc[0, "pattern"] == "sink"
    with pytest.raises(ValueError, match="cannot attend to the later token"):
        rank_heads(attn, query=1, key=3, causal=True)
    with pytest.raises(ValueError, match="out of range"):
        rank_heads(attn, 4, 0)
    with pytest.raises(ValueError, match="at least one token"):
        rank_heads(attn, [], 0)
    with pytest.raises(ValueError, match="contrast"):
        rank_heads(attn, 3, 0, by="size")
    only = rank_heads(torch.eye(2)[None, None].tril(), 1, 0, causal=True)   # no other query sees the key
    assert only["others"].isna().all() and only["contrast"].tolist() == only["weight"].tolist()
    assert "other word to compare it with" in ranking_sentences(only, "b", "a")[0]
