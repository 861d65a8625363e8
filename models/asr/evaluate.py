"""Error rates of trained ASR models on a corpus split: fp32 against the RSQ int8 model.

    cascade asr evaluate --model OUT/fp32 --int8 OUT/int8 --corpus CORPUS \\
        --split test --beam 8 --out evaluation.json

The test split holds voices no training utterance used, so these are error rates on unseen
voices. Any labelled split is taken: synthetic voices, recordings of people
(:mod:`jobs.speech_human`, voices named ``human-...``) or both. For each model: CER and WER
(greedy decoding, and prefix beam search with ``--beam``), the edit operations behind them, the
most frequent confusions, and the same per language (English, Mandarin, ...) and per source
(``synthetic`` / ``people``). Each utterance is decoded restricted to its own language's
characters (the corpus row's language; ``--unrestricted`` turns that off), and
``foreign_tokens`` counts output characters outside the utterance's language: of the decoding
reported, and of plain unrestricted greedy decoding (``foreign_tokens_unrestricted``, what the
output layer alone would emit). Reference characters outside the model's alphabet (fitted from
its training transcripts, so a character no training utterance held) are counted,
``unseen_characters`` with each character's count in ``unseen``: the model cannot emit them, so
each is an error in the CER, and the utterance is scored like any other. The int8 figures come
from the artifact's weights
fake-quantized with its ``quantization`` record (:func:`models.asr.rsq.quantized_model`): what
the int8 artifact built from it by ``compilers/`` computes.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from domains.speech.audio_features import language_group
from models.asr.artifact import AsrArtifact, load_artifact
from models.asr.corpus import SOURCES, Utterances, load_split, source_of
from models.asr.inference import decode, log_probs_of
from models.asr.metrics import EditCounts, character_errors, word_errors
from models.asr.model import Alphabet, ConvDFSMN
from models.asr.rsq import quantized_model

TOP_CONFUSIONS = 15


def _counts(counts: EditCounts) -> dict[str, Any]:
    return {
        "rate": counts.rate,
        "errors": counts.errors,
        "substitutions": counts.substitutions,
        "deletions": counts.deletions,
        "insertions": counts.insertions,
        "reference_length": counts.reference_length,
    }


def _breakdown(
    references: Sequence[str], hypotheses: Sequence[str], keys: Sequence[str], confusions: int
) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key in sorted(set(keys)):
        picked = [i for i, k in enumerate(keys) if k == key]
        refs = [references[i] for i in picked]
        hyps = [hypotheses[i] for i in picked]
        chars = character_errors(refs, hyps)
        out[key] = {
            "utterances": len(picked),
            "cer": chars.rate,
            "wer": word_errors(refs, hyps).rate,
            "top_confusions": chars.top_confusions(confusions),
        }
    return out


def error_report(
    references: Sequence[str],
    hypotheses: Sequence[str],
    languages: Sequence[str],
    sources: Sequence[str] | None = None,
    alphabet: Alphabet | None = None,
) -> dict[str, Any]:
    """CER/WER overall, per language group and (given ``sources``) per source, with the top
    character confusions; given the ``alphabet``, ``foreign_tokens``: output characters outside
    each utterance's language (per language too)."""
    chars = character_errors(references, hypotheses)
    words = word_errors(references, hypotheses)
    groups = [language_group(lang) for lang in languages]
    report: dict[str, Any] = {
        "utterances": len(references),
        "cer": chars.rate,
        "wer": words.rate,
        "sentence_error_rate": sum(r != h for r, h in zip(references, hypotheses, strict=True))
        / max(len(references), 1),
        "characters": _counts(chars),
        "words": _counts(words),
        "top_confusions": chars.top_confusions(TOP_CONFUSIONS),
        "per_language": _breakdown(references, hypotheses, groups, 5),
    }
    if sources is not None:
        report["per_source"] = _breakdown(references, hypotheses, sources, 5)
    if alphabet is not None:
        foreign = [
            alphabet.foreign_tokens(h, lang) for h, lang in zip(hypotheses, languages, strict=True)
        ]
        report["foreign_tokens"] = sum(foreign)
        for group in report["per_language"]:
            report["per_language"][group]["foreign_tokens"] = sum(
                f for f, g in zip(foreign, groups, strict=True) if g == group
            )
    return report


def int8_model(artifact: AsrArtifact) -> ConvDFSMN:
    """The artifact's model fake-quantized with its RSQ record; a clear error for a float one."""
    record = artifact.quantization
    if not record or "activation_ranges" not in record:
        raise ValueError("this ASR model has no quantization record (activation_ranges)")
    return quantized_model(artifact.model, record["activation_ranges"], bits=int(record["bits"]))


def decoding_language(alphabet: Alphabet, language: str, restrict: bool) -> str | None:
    """The language to restrict an utterance to: its own when the alphabet knows it."""
    if not restrict or language_group(language) not in alphabet.languages:
        return None
    return language


def evaluate_model(
    model: ConvDFSMN,
    artifact: AsrArtifact,
    data: Utterances,
    *,
    beam: int = 0,
    restrict: bool = True,
) -> dict[str, Any]:
    """Greedy (and with ``beam`` > 0 also beam) error reports of ``model`` on ``data``, each
    utterance decoded for its own language when ``restrict`` (one forward pass per utterance
    serves every decoding)."""
    started = time.perf_counter()
    model.eval()
    alphabet, subsample = artifact.alphabet, model.config.subsample
    sources = [source_of(v) for v in data.voices]
    greedy, plain, beamed = [], [], []
    restricted = 0
    for features, language in zip(data.features, data.languages, strict=True):
        log_probs = log_probs_of(model, features)
        lang = decoding_language(alphabet, language, restrict)
        restricted += lang is not None
        greedy.append(decode(log_probs, alphabet, subsample, language=lang).text)
        plain.append(decode(log_probs, alphabet, subsample).text if lang else greedy[-1])
        if beam > 0:
            beamed.append(decode(log_probs, alphabet, subsample, beam=beam, language=lang).text)
    report: dict[str, Any] = {
        "restricted_utterances": restricted,
        "greedy": error_report(data.texts, greedy, data.languages, sources, alphabet),
    }
    report["foreign_tokens"] = report["greedy"]["foreign_tokens"]
    report["foreign_tokens_unrestricted"] = sum(
        alphabet.foreign_tokens(h, lang) for h, lang in zip(plain, data.languages, strict=True)
    )
    report["examples"] = [
        {"reference": r, "hypothesis": h, "language": lang, "source": src}
        for r, h, lang, src in zip(data.texts, greedy, data.languages, sources, strict=True)
        if r != h
    ][:20]
    if beam > 0:
        report[f"beam{beam}"] = error_report(data.texts, beamed, data.languages, sources, alphabet)
    # The references' characters this model's alphabet lacks (data may be read with another's).
    report.update(data.encoded(alphabet).unseen_report())
    report["alphabet"] = {"size": len(alphabet), "fitted": alphabet.fitted}
    report["seconds"] = time.perf_counter() - started
    return report


def evaluate_artifacts(
    fp32: Path,
    int8: Path | None,
    corpus: Path,
    *,
    split: str = "test",
    beam: int = 0,
    restrict: bool = True,
) -> dict[str, Any]:
    """fp32 (and int8) error rates on every labelled utterance of ``split`` of ``corpus``.

    Headline keys ``cer_fp32``, ``wer_fp32``, ``cer_int8``, ``wer_int8``, ``int8_cer_delta``
    (points of CER) are on the synthetic voices when the split has any (a model trained on them
    is expected to do far worse on people, and mixing the two would make the headline depend on
    how many recordings a partition happens to hold), else on every utterance
    (``headline_source`` says which). Per source: ``cer_synthetic_*``, ``cer_people_*`` (and
    ``cer_human_*``, the older name), each model's report under ``fp32`` / ``int8`` with
    ``per_source`` and ``per_language``; ``cer_by_language_*`` and ``foreign_tokens_*``;
    ``unseen_characters``, ``unseen_utterances`` and ``unseen``: reference characters outside
    the fp32 model's alphabet (each model's report has its own count)."""
    float_artifact = load_artifact(fp32)
    data = load_split(corpus, split, float_artifact.alphabet)
    if len(data) == 0:
        raise ValueError(f"split {split!r} of {corpus} has no utterances")
    if data.n_mels != float_artifact.n_mels:
        raise ValueError(
            f"the corpus has {data.n_mels} mel bins, the model expects {float_artifact.n_mels}"
        )
    sources = [source_of(v) for v in data.voices]
    headline = "synthetic" if "synthetic" in sources else "all"
    result: dict[str, Any] = {
        "split": split,
        "utterances": len(data),
        "voices": len(set(data.voices)),
        "sources": {s: sources.count(s) for s in SOURCES if s in sources},
        "headline_source": headline,
        "restricted_to_language": restrict,
        **data.unseen_report(),
    }
    models = [("fp32", float_artifact.model, float_artifact)]
    if int8 is not None:
        quant_artifact = load_artifact(int8)
        models.append(("int8", int8_model(quant_artifact), quant_artifact))
    for kind, model, artifact in models:
        report = evaluate_model(model, artifact, data, beam=beam, restrict=restrict)
        result[kind] = report
        greedy = report["greedy"]
        top = greedy["per_source"].get(headline, greedy)
        result[f"cer_{kind}"], result[f"wer_{kind}"] = top["cer"], top["wer"]
        for source, rates in greedy["per_source"].items():
            result[f"cer_{source}_{kind}"] = rates["cer"]
            result[f"wer_{source}_{kind}"] = rates["wer"]
        if "people" in greedy["per_source"]:
            result[f"cer_human_{kind}"] = result[f"cer_people_{kind}"]
            result[f"wer_human_{kind}"] = result[f"wer_people_{kind}"]
        result[f"cer_by_language_{kind}"] = {g: v["cer"] for g, v in greedy["per_language"].items()}
        result[f"foreign_tokens_{kind}"] = report["foreign_tokens"]
        if beam > 0:
            # The beam's headline is over the same utterances as the greedy one.
            beamed = report[f"beam{beam}"]
            top_beam = beamed["per_source"].get(headline, beamed)
            result[f"cer_{kind}_beam"] = top_beam["cer"]
            result[f"wer_{kind}_beam"] = top_beam["wer"]
    if int8 is not None:
        result["int8_cer_delta"] = 100.0 * (result["cer_int8"] - result["cer_fp32"])
    if "people" in sources:
        result["human"] = {"utterances": sources.count("people")}
    return result


def summary_lines(result: dict[str, Any]) -> list[str]:
    """A few readable lines: rates per model and language, the top confusions."""
    lines = [f"{result['split']}: {result['utterances']} utterances, {result['voices']} voices"]
    for kind in ("fp32", "int8"):
        if kind not in result:
            continue
        greedy = result[kind]["greedy"]
        langs = ", ".join(
            f"{g} CER {v['cer']:.2%} WER {v['wer']:.2%} ({v['utterances']})"
            for g, v in greedy["per_language"].items()
        )
        lines.append(f"{kind}: CER {greedy['cer']:.2%} WER {greedy['wer']:.2%}; {langs}")
        top = ", ".join(
            f"{c['reference'] or '∅'}→{c['hypothesis'] or '∅'}×{c['count']}"
            for c in greedy["top_confusions"][:8]
        )
        lines.append(f"{kind} top confusions: {top}")
    for source in SOURCES:
        rates = ", ".join(
            f"{kind} CER {result[f'cer_{source}_{kind}']:.2%}"
            for kind in ("fp32", "int8")
            if f"cer_{source}_{kind}" in result
        )
        if rates:
            lines.append(f"{source} ({result['sources'][source]}): {rates}")
    foreign = ", ".join(
        f"{kind} {result[kind]['foreign_tokens']} "
        f"({result[kind]['foreign_tokens_unrestricted']} unrestricted)"
        for kind in ("fp32", "int8")
        if kind in result
    )
    lines.append(f"output characters outside the utterance's language: {foreign}")
    if result.get("unseen_characters"):
        shown = "".join(list(result["unseen"])[:20])
        lines.append(
            f"characters the model never saw in training: {result['unseen_characters']} in "
            f"{result['unseen_utterances']} utterances ({shown}), each counted as an error"
        )
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, required=True, help="fp32 artifact (dir or .pt)")
    parser.add_argument("--int8", type=Path, default=None, help="RSQ int8 artifact")
    parser.add_argument("--corpus", type=Path, required=True)
    parser.add_argument("--split", default="test", choices=("train", "dev", "test"))
    parser.add_argument("--beam", type=int, default=0)
    parser.add_argument(
        "--unrestricted",
        action="store_true",
        help="decode every token, not only the utterance's language's characters",
    )
    parser.add_argument("--out", type=Path, default=None, help="write the full report here")
    args = parser.parse_args(argv)
    result = evaluate_artifacts(
        args.model,
        args.int8,
        args.corpus,
        split=args.split,
        beam=args.beam,
        restrict=not args.unrestricted,
    )
    print("\n".join(summary_lines(result)))
    if args.out is not None:
        args.out.write_text(json.dumps(result, indent=2, ensure_ascii=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
