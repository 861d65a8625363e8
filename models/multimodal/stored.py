"""A trained multimodal model as the registry keeps it, scored on any corpus's split.

A registered version's folder (artifact ``model`` of its training run) holds

- DeepSpeed's final module states: ``mp_rank_00_model_states.pt`` (``module``: every parameter
  but the experts') and ``layer_L_expert_G_mp_rank_00_model_states.pt`` (expert ``G`` of MoE
  layer ``L``, global ids);
- ``model_config.json``: the :class:`~models.multimodal.model.MultimodalConfig` it was built with
  (its vocabulary widened to its corpus's tokenizer);
- ``tokenizer.json``: the caption tokenizer of the corpus it was trained on
  (:mod:`domains.captions.tokenizer`);
- ``digests.json``: the sha256 of each of those files, checked before any of them is read;
- ``result.json``: the training's figures.

``digests.json`` sits beside the files it vouches for, so it guards against a broken copy, not
against whoever can write the store: a registered version's files are checked against the
digests its registration recorded (:func:`cascade.registry.download_verified`) before this
module reads them.

Nothing is unpickled: the state dicts are read with ``torch.load(..., weights_only=True)``, the
rest is JSON. The caption tokenizer is refitted for every corpus, so another partition's token
ids mean nothing to a model: :func:`score_stored_model` tokenizes the split's captions again
with the model's own tokenizer, which lets two versions be scored on the same rows. It runs in a
worker process (DeepSpeed's MoE layers need a process group; the one process holds every
expert)::

    python -m models.multimodal.stored --model DIR --corpus CORPUS --out OUT [--limit N]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shutil
import sys
from pathlib import Path
from typing import Any

import torch

from cascade.artifacts import sha256_file
from cascade.config import Settings
from cascade.results import write_result
from cascade.training.launch import init_distributed, launch_for_result
from domains.captions.tokenizer import CaptionTokenizer
from models.multimodal.model import PAD, ImageTextTransformer, MoEConfig, MultimodalConfig
from models.multimodal.pairs import SPLITS, Pairs, corpus_vocab_size, load_split

MODULE_STATES = "mp_rank_00_model_states.pt"
EXPERT_STATES = "layer_*_expert_*_mp_rank_00_model_states.pt"
MODEL_CONFIG_FILE = "model_config.json"
TOKENIZER_FILE = "tokenizer.json"
DIGESTS_FILE = "digests.json"
SCORE_KEYS = ("eval_pairs", "i2t_recall_at_1", "t2i_recall_at_1")
"""Keys every complete scoring ``result.json`` carries."""


class NoStoredTokenizer(FileNotFoundError):
    """The model was stored without its caption tokenizer (trained before it was kept)."""


def save_model_files(final: Path, config: MultimodalConfig, corpus: Path | None) -> None:
    """Write the model's config, its corpus's tokenizer (when the corpus has one) and the
    digests beside the module states in ``final``."""
    final = Path(final)
    (final / MODEL_CONFIG_FILE).write_text(json.dumps(dataclasses.asdict(config), indent=1))
    tokenizer = None if corpus is None else Path(corpus) / TOKENIZER_FILE
    if tokenizer is not None and tokenizer.is_file():
        CaptionTokenizer.load(tokenizer)  # refuse a foreign file now, not when scoring
        shutil.copyfile(tokenizer, final / TOKENIZER_FILE)
    files = [final / MODULE_STATES, *sorted(final.glob(EXPERT_STATES)), final / MODEL_CONFIG_FILE]
    if (final / TOKENIZER_FILE).is_file():
        files.append(final / TOKENIZER_FILE)
    digests = {f.name: sha256_file(f) for f in files}
    (final / DIGESTS_FILE).write_text(json.dumps(digests, indent=1, sort_keys=True))


def stored_files(final: Path) -> list[Path]:
    """The files of ``final`` the registry keeps: those ``digests.json`` names, and itself."""
    listing = Path(final) / DIGESTS_FILE
    return [listing.parent / name for name in sorted(json.loads(listing.read_text()))] + [listing]


def check_digests(folder: Path) -> None:
    """Raise unless every file ``digests.json`` names is there with that sha256."""
    listing = Path(folder) / DIGESTS_FILE
    if not listing.is_file():
        raise ValueError(f"{folder} is not a stored multimodal model: no {DIGESTS_FILE}")
    for name, expected in json.loads(listing.read_text()).items():
        path = Path(folder) / name
        if not path.is_file():
            raise ValueError(f"{folder}: {name} is listed in {DIGESTS_FILE} but missing")
        if sha256_file(path) != expected:
            raise ValueError(f"{folder}: {name} does not match its sha256 in {DIGESTS_FILE}")


def stored_tokenizer(folder: Path) -> CaptionTokenizer:
    path = Path(folder) / TOKENIZER_FILE
    if not path.is_file():
        raise NoStoredTokenizer(
            f"{folder} holds no {TOKENIZER_FILE}: the model was stored without its caption "
            "tokenizer, so it cannot read another corpus's captions"
        )
    return CaptionTokenizer.load(path)


def load_stored_model(folder: Path) -> tuple[ImageTextTransformer, CaptionTokenizer]:
    """The model (eval mode, all experts in this process) and its tokenizer; call it inside a
    process group (:func:`~cascade.training.launch.init_distributed`)."""
    from deepspeed.moe.layer import MoE

    folder = Path(folder)
    check_digests(folder)
    tokenizer = stored_tokenizer(folder)
    fields = json.loads((folder / MODEL_CONFIG_FILE).read_text())
    moe = fields.pop("moe")
    config = MultimodalConfig(
        **{**fields, "ep_size": 1}, moe=None if moe is None else MoEConfig(**moe)
    )
    model = ImageTextTransformer(config)
    for module in model.modules():
        if isinstance(module, MoE):
            module.set_deepspeed_parallelism()
    states = torch.load(folder / MODULE_STATES, map_location="cpu", weights_only=True)["module"]
    # One process holds every expert: the global expert ids of the files are the local ones.
    for path in sorted(folder.glob(EXPERT_STATES)):
        states.update(torch.load(path, map_location="cpu", weights_only=True))
    model.load_state_dict(states)
    return model.eval(), tokenizer


def caption_tokens(
    tokenizer: CaptionTokenizer, captions: list[str], max_tokens: int
) -> torch.Tensor:
    """``(len(captions), max_tokens)`` ids of ``captions`` read by ``tokenizer`` (cut or padded
    to ``max_tokens``, as :func:`~models.multimodal.pairs.load_split` does)."""
    tokens = torch.full((len(captions), max_tokens), PAD, dtype=torch.int64)
    for row, caption in enumerate(captions):
        ids = tokenizer.encode(caption)[:max_tokens]
        tokens[row, : len(ids)] = torch.tensor(ids, dtype=torch.int64)
    return tokens


def retokenized(pairs: Pairs, tokenizer: CaptionTokenizer, max_tokens: int) -> Pairs:
    """``pairs`` with their captions tokenized by ``tokenizer`` (:func:`caption_tokens`)."""
    tokens = caption_tokens(tokenizer, list(pairs.captions), max_tokens)
    return Pairs(pairs.pair_ids, pairs.images, tokens, pairs.captions)


def score_split(
    folder: Path, corpus: Path, split: str = "test", limit: int | None = None
) -> dict[str, Any]:
    """Recall@1/5 both ways of the stored model on the first ``limit`` pairs (by ``pair_id``)
    of ``corpus``'s ``split``, read with the model's own tokenizer (in a process group)."""
    from models.multimodal.evaluate import retrieval_metrics

    model, tokenizer = load_stored_model(folder)
    max_tokens = model.config.max_tokens
    # The corpus's own ids are only range-checked here, then replaced.
    vocab = max(corpus_vocab_size(corpus) or 0, model.config.vocab_size, tokenizer.vocab_size)
    pairs = load_split(corpus, split, max_tokens=max_tokens, vocab_size=vocab, limit=limit)
    if len(pairs) < 2:
        raise ValueError(f"{corpus} has {len(pairs)} {split} pairs; retrieval needs >= 2")
    torch.manual_seed(0)  # the gate's random token selection
    metrics = retrieval_metrics(model, retokenized(pairs, tokenizer, max_tokens))
    # Caption characters the model's tokenizer never saw often enough in training: read as
    # their UTF-8 bytes, counted so a corpus in another script shows.
    unseen = sum(tokenizer.unseen(caption) for caption in pairs.captions)
    return {
        **metrics,
        "eval_pairs": len(pairs),
        "split": split,
        "corpus": str(corpus),
        "unseen_characters": unseen,
    }


def score_stored_model(
    settings: Settings,
    folder: Path,
    corpus: Path,
    out: Path,
    *,
    split: str = "test",
    limit: int | None = None,
    echo: bool = True,
) -> dict[str, Any]:
    """:func:`score_split` in a worker process; ``OUT/result.json``. Raises
    :class:`NoStoredTokenizer` before starting one when the model has no tokenizer."""
    stored_tokenizer(folder)
    out = Path(out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    args = ["--model", str(Path(folder).resolve()), "--corpus", str(Path(corpus).resolve())]
    args += ["--split", split, "--out", str(out)]
    if limit is not None:
        args += ["--limit", str(limit)]
    return launch_for_result(
        "models.multimodal.stored",
        args,
        what=f"scoring the multimodal model in {folder}",
        out_dir=out,
        keys=SCORE_KEYS,
        processes=1,
        settings=settings,
        echo=echo,
        append=False,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, type=Path, help="stored model folder")
    parser.add_argument("--corpus", required=True, type=Path, help="corpus folder")
    parser.add_argument("--split", default="test", choices=SPLITS)
    parser.add_argument("--limit", type=int, default=None, help="first N pairs by pair_id")
    parser.add_argument("--out", required=True, type=Path)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    init_distributed()
    result = score_split(args.model, args.corpus, args.split, args.limit)
    write_result(args.out / "result.json", result)
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
