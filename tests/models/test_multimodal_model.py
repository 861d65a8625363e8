"""The image-text model: MoE routing with capacity and load balancing, equal active parameters
of the dense and MoE twins, the attention layout, recall@k, the pair generator and the corpus
loader."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from models.multimodal.config_registry import CONFIGS, dense_twin, get_config
from models.multimodal.evaluate import recall_at_k
from models.multimodal.model import (
    ImageTextTransformer,
    MoEConfig,
    MultimodalConfig,
    PrototypedMoE,
    objective,
    parameter_counts,
)
from models.multimodal.pairs import (
    COLOURS,
    HELDOUT,
    HELDOUT_TEMPLATES,
    POSITIONS,
    SHAPES,
    generate_pairs,
    load_split,
    template_of,
    tokenize,
)


def test_prototyped_moe_routes_counts_drops_and_learns_to_balance() -> None:
    torch.manual_seed(0)
    layer = PrototypedMoE(
        16, 32, MoEConfig(num_experts=4, prototypes=2, capacity_factor=0.5), 1, 0.0
    )
    # Skewed inputs: every token leans the same way, so the initial routing is uneven.
    x = torch.randn(2, 40, 16) * 0.3 + torch.randn(16)
    out, aux = layer(x)
    stats = layer.stats
    assert stats is not None and out.shape == x.shape and float(aux.detach()) > 0
    assert stats.counts.shape == (2, 2) and stats.counts.sum(dim=1).tolist() == [80, 80]
    assert stats.capacity == 20  # ceil(80 tokens / 2 experts * 0.5)
    # Each group has 2 x 20 slots for 80 tokens: at least 40 tokens per group are dropped.
    assert stats.dropped >= 80 and stats.dropped == int((stats.counts - 20).clamp(min=0).sum())
    before = stats.load_cv

    gates = [p for n, p in layer.named_parameters() if ".gate." in n]
    assert len(gates) == 2
    optimizer = torch.optim.Adam(gates, lr=0.05)
    for _ in range(25):
        _, aux = layer(x)
        optimizer.zero_grad()
        aux.backward()
        optimizer.step()
    layer(x)
    assert layer.stats is not None and layer.stats.load_cv < before / 2

    unbounded = PrototypedMoE(
        16, 32, MoEConfig(num_experts=4, prototypes=2, drop_tokens=False), 1, 0.0
    )
    unbounded(x)
    assert unbounded.stats is not None and unbounded.stats.dropped == 0


@pytest.mark.parametrize("name", ["debug", "small", "base"])
def test_dense_twin_has_the_same_active_parameters(name: str) -> None:
    moe_config = get_config(name)
    assert moe_config.is_moe and f"{name}-dense" in CONFIGS
    moe = parameter_counts(ImageTextTransformer(moe_config.model))
    dense = parameter_counts(ImageTextTransformer(dense_twin(moe_config).model))
    assert moe["active"] - moe["router"] == dense["active"] == dense["total"]
    assert moe["router"] > 0 and moe["total"] > 1.5 * dense["total"]


def test_text_embedding_never_sees_the_image_but_the_caption_does() -> None:
    # The dense twin: in an MoE model tokens of one batch also meet through expert capacity
    # (which of them a full expert drops), which is routing, not attention.
    torch.manual_seed(0)
    config = dense_twin(get_config("debug")).model
    model = ImageTextTransformer(config).eval()
    pairs = generate_pairs(40, "train", max_tokens=config.max_tokens)
    images, tokens = pairs.images[:4], pairs.tokens[:4]
    with torch.no_grad():
        a = model(images, tokens)
        b = model(images.flip(0), tokens)
    torch.testing.assert_close(a.text_embedding, b.text_embedding)
    assert not torch.allclose(a.image_embedding, b.image_embedding)
    assert not torch.allclose(a.logits, b.logits)
    loss, parts = objective(model, a, tokens)
    assert torch.isfinite(loss) and parts["aux"] == 0 and parts["contrastive"] > 0


def test_recall_at_k_on_a_known_similarity_matrix() -> None:
    sim = np.array(
        [
            [0.9, 0.1, 0.0, 0.0],  # image 0: its text first
            [0.8, 0.7, 0.0, 0.0],  # image 1: its text second
            [0.0, 0.0, 0.1, 0.5],  # image 2: its text second
            [0.0, 0.0, 0.0, 0.2],  # image 3: its text first
        ]
    )
    r = recall_at_k(sim, ks=(1, 2))
    assert r["i2t_recall_at_1"] == 0.5 and r["i2t_recall_at_2"] == 1.0
    # Texts: text 0 -> image 0 first; text 1 -> image 1; text 2 -> image 2; text 3 -> image 2.
    assert r["t2i_recall_at_1"] == 0.75 and r["t2i_recall_at_2"] == 1.0
    # With images 2 and 3 described by the same caption, text 3 retrieving image 2 is a hit.
    grouped = recall_at_k(sim, ks=(1,), groups=np.array([0, 1, 2, 2]))
    assert grouped["t2i_recall_at_1"] == 1.0 and grouped["i2t_recall_at_1"] == 0.75
    with pytest.raises(ValueError, match="square"):
        recall_at_k(np.zeros((2, 3)))


def test_generator_is_deterministic_and_draws_what_the_caption_says() -> None:
    a = generate_pairs(50, "test", max_tokens=12, seed=3)
    b = generate_pairs(50, "test", max_tokens=12, seed=3)
    assert len(a) == 5 and a.pair_ids == b.pair_ids and torch.equal(a.images, b.images)
    for image, caption in zip(a.images.numpy(), a.captions, strict=True):
        words = caption.split()
        colour, position = words[2], " ".join(words[6:])
        x, y = (np.array(POSITIONS[position]) * 64).astype(int)
        # The shape's centre pixel carries its colour (the square, circle, triangle and cross
        # all cover their centre), scaled by at most 15%.
        pixel, want = image[y, x].astype(float), np.array(COLOURS[colour])
        assert np.all(np.abs(pixel - want) <= 0.16 * want + 1), (caption, pixel)
    assert tokenize("a big red cross", 4)[0] == 1 and len(tokenize("a", 6)) == 6


def test_held_out_templates_are_never_trained_on_and_make_their_own_split() -> None:
    held_out = set(HELDOUT_TEMPLATES)
    splits = {s: generate_pairs(200, s, max_tokens=12) for s in ("train", "test", HELDOUT)}
    seen = {template_of(c) for c in splits["train"].captions}
    # Every colour and every shape is trained on, but never in a held-out pairing.
    assert not seen & held_out and not {template_of(c) for c in splits["test"].captions} & held_out
    assert {c for c, _ in seen} == set(COLOURS) and {s for _, s in seen} == set(SHAPES)
    unseen = splits[HELDOUT]
    assert len(unseen) == len(splits["test"]) == 20
    assert {template_of(c) for c in unseen.captions} <= held_out
    assert not set(unseen.pair_ids) & set(splits["test"].pair_ids)
    # Counts per split stay a function of the index: a redraw keeps the pair in its split.
    assert len(splits["train"]) == 160
    again = generate_pairs(200, HELDOUT, max_tokens=12)
    assert again.captions == unseen.captions and torch.equal(again.images, unseen.images)
    with pytest.raises(ValueError, match="not a generator caption"):
        template_of("a photo")


def test_load_split_reads_the_corpus_layout_and_refuses_bad_rows(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)

    def row(i: int, **changes: object) -> dict[str, object]:
        image = rng.integers(0, 255, (64, 64, 3), dtype=np.uint8)
        return {
            "pair_id": f"p{i:03d}",
            "image": image.tobytes(),
            "tokens": [1, 5 + i, 2],
            "caption": f"caption {i}",
            "language": "en",
        } | changes

    # The corpus job's layout: shards/split=S/shard=K, token ids as `token_ids`, and other
    # parquet (the manifest) beside the shards, which is not training data.
    shard = tmp_path / "shards" / "split=test" / "shard=0"
    shard.mkdir(parents=True)
    pd.DataFrame([row(3), row(1)]).rename(columns={"tokens": "token_ids"}).to_parquet(
        shard / "a.parquet"
    )
    (tmp_path / "manifest").mkdir()
    pd.DataFrame({"pair_id": ["p001"], "status": ["kept"]}).to_parquet(
        tmp_path / "manifest" / "m.parquet"
    )
    pd.DataFrame([row(2, split="test"), row(0, split="train")]).to_parquet(
        tmp_path / "shards" / "mixed.parquet"
    )
    test = load_split(tmp_path, "test", max_tokens=2, vocab_size=32)
    assert test.pair_ids == ["p001", "p002", "p003"]
    assert test.images.shape == (3, 64, 64, 3) and test.images.dtype == torch.uint8
    assert test.tokens.tolist() == [[1, 6], [1, 7], [1, 8]]  # cut to max_tokens
    train = load_split(tmp_path, "train", max_tokens=5, vocab_size=32)
    assert train.tokens.tolist() == [[1, 5, 2, 0, 0]]  # padded with 0
    with pytest.raises(ValueError, match="outside the model's vocabulary of 7"):
        load_split(tmp_path, "test", max_tokens=5, vocab_size=7)
    bad = tmp_path / "bad"
    bad.mkdir()
    pd.DataFrame([row(9, image=b"\x00" * 10, split="val")]).to_parquet(bad / "x.parquet")
    with pytest.raises(ValueError, match="p009: image holds 10 bytes"):
        load_split(bad, "val", max_tokens=5, vocab_size=32)
    with pytest.raises(FileNotFoundError, match="not a multimodal corpus"):
        load_split(tmp_path / "nowhere", "train", max_tokens=5, vocab_size=32)


def test_configs_are_validated() -> None:
    with pytest.raises(ValueError, match="split evenly into prototypes=3"):
        MoEConfig(num_experts=8, prototypes=3)
    with pytest.raises(ValueError, match="ep_size=3 must divide"):
        MultimodalConfig(moe=MoEConfig(num_experts=8, prototypes=2), ep_size=3)
    with pytest.raises(ValueError, match="unknown multimodal config 'huge'"):
        get_config("huge")
    with pytest.raises(ValueError, match="batch_size must be >= 2"):
        dataclasses.replace(get_config("debug"), batch_size=1)
    assert get_config("base").flat_params()["model.moe.num_experts"] == "16"


def test_stored_model_keeps_its_tokenizer_and_refuses_changed_or_missing_files(
    tmp_path: Path,
) -> None:
    from domains.captions.tokenizer import CaptionTokenizer
    from models.multimodal import stored

    corpus, final = tmp_path / "corpus", tmp_path / "final"
    corpus.mkdir()
    final.mkdir()
    CaptionTokenizer(chars=("a", "b")).save(corpus / "tokenizer.json")
    torch.save({"module": {"w": torch.zeros(2)}}, final / stored.MODULE_STATES)
    torch.save({"e": torch.ones(1)}, final / "layer_0_expert_1_mp_rank_00_model_states.pt")
    stored.save_model_files(final, MultimodalConfig(), corpus)
    assert [p.name for p in stored.stored_files(final)] == [
        "layer_0_expert_1_mp_rank_00_model_states.pt",
        "model_config.json",
        stored.MODULE_STATES,
        "tokenizer.json",
        "digests.json",
    ]
    stored.check_digests(final)
    tokenizer = stored.stored_tokenizer(final)
    assert tokenizer.chars == ("a", "b")

    # Captions are cut or padded to the model's length with the model's own ids.
    pairs = generate_pairs(20, "test", max_tokens=4)
    again = stored.retokenized(pairs, tokenizer, 4)
    assert again.tokens[0].tolist() == tokenizer.encode(pairs.captions[0])[:4]
    assert again.pair_ids == pairs.pair_ids and again.images is pairs.images

    torch.save({"e": torch.zeros(1)}, final / "layer_0_expert_1_mp_rank_00_model_states.pt")
    with pytest.raises(ValueError, match="does not match its sha256"):
        stored.check_digests(final)
    (final / "tokenizer.json").unlink()
    with pytest.raises(stored.NoStoredTokenizer, match="stored without its caption tokenizer"):
        stored.stored_tokenizer(final)
