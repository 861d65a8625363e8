"""Error rates of trained ASR models on a corpus split: fp32 against the RSQ int8 model.

    python -m models.asr.evaluate --model OUT/fp32 --int8 OUT/int8 --corpus CORPUS \\
        --split test --beam 8 --out evaluation.json

The test split holds voices no training utterance used, so these are error rates on unseen
voices. For each model: CER and WER (greedy decoding, and prefix beam search with ``--beam``),
the edit operations behind them, the most frequent confusions, and the same per language
(English, Mandarin). The int8 figures come from the artifact's weights fake-quantized with its
``quantization`` record (:func:`models.asr.rsq.quantized_model`): what the int8 artifact built
from it by ``compilers/`` computes.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from models.asr.artifact import AsrArtifact, load_artifact
from models.asr.corpus import Utterances, load_split
from models.asr.inference import transcribe
from models.asr.metrics import EditCounts, character_errors, word_errors
from models.asr.model import ConvDFSMN
from models.asr.rsq import quantized_model

TOP_CONFUSIONS = 15


def language_group(language: str) -> str:
    """``english`` for every English accent, ``mandarin`` for ``cmn``, else the code itself."""
    if language.startswith("en"):
        return "english"
    if language.startswith("cmn") or language.startswith("zh"):
        return "mandarin"
    return language


def _counts(counts: EditCounts) -> dict[str, Any]:
    return {
        "rate": counts.rate,
        "errors": counts.errors,
        "substitutions": counts.substitutions,
        "deletions": counts.deletions,
        "insertions": counts.insertions,
        "reference_length": counts.reference_length,
    }


def error_report(
    references: Sequence[str], hypotheses: Sequence[str], languages: Sequence[str]
) -> dict[str, Any]:
    """CER/WER overall and per language group, with the top character confusions."""
    chars = character_errors(references, hypotheses)
    words = word_errors(references, hypotheses)
    per_language: dict[str, Any] = {}
    for group in sorted({language_group(lang) for lang in languages}):
        picked = [i for i, lang in enumerate(languages) if language_group(lang) == group]
        refs = [references[i] for i in picked]
        hyps = [hypotheses[i] for i in picked]
        group_chars = character_errors(refs, hyps)
        per_language[group] = {
            "utterances": len(picked),
            "cer": group_chars.rate,
            "wer": word_errors(refs, hyps).rate,
            "top_confusions": group_chars.top_confusions(5),
        }
    return {
        "utterances": len(references),
        "cer": chars.rate,
        "wer": words.rate,
        "sentence_error_rate": sum(r != h for r, h in zip(references, hypotheses, strict=True))
        / max(len(references), 1),
        "characters": _counts(chars),
        "words": _counts(words),
        "top_confusions": chars.top_confusions(TOP_CONFUSIONS),
        "per_language": per_language,
    }


def transcribe_all(
    model: ConvDFSMN, artifact: AsrArtifact, data: Utterances, beam: int
) -> list[str]:
    model.eval()
    return [transcribe(model, artifact.alphabet, f, beam=beam).text for f in data.features]


def int8_model(artifact: AsrArtifact) -> ConvDFSMN:
    """The artifact's model fake-quantized with its RSQ record; a clear error for a float one."""
    record = artifact.quantization
    if not record or "activation_ranges" not in record:
        raise ValueError("this ASR model has no quantization record (activation_ranges)")
    return quantized_model(artifact.model, record["activation_ranges"], bits=int(record["bits"]))


def evaluate_model(
    model: ConvDFSMN, artifact: AsrArtifact, data: Utterances, *, beam: int = 0
) -> dict[str, Any]:
    """Greedy (and with ``beam`` > 0 also beam) error reports of ``model`` on ``data``."""
    started = time.perf_counter()
    greedy = transcribe_all(model, artifact, data, 0)
    report: dict[str, Any] = {"greedy": error_report(data.texts, greedy, data.languages)}
    report["examples"] = [
        {"reference": r, "hypothesis": h, "language": lang}
        for r, h, lang in zip(data.texts, greedy, data.languages, strict=True)
        if r != h
    ][:20]
    if beam > 0:
        beamed = transcribe_all(model, artifact, data, beam)
        report[f"beam{beam}"] = error_report(data.texts, beamed, data.languages)
    report["seconds"] = time.perf_counter() - started
    return report


def evaluate_artifacts(
    fp32: Path, int8: Path | None, corpus: Path, *, split: str = "test", beam: int = 0
) -> dict[str, Any]:
    """fp32 (and int8) error rates on ``split`` of ``corpus``; headline keys ``cer_fp32``,
    ``wer_fp32``, ``cer_int8``, ``wer_int8``, ``int8_cer_delta`` (points of CER) are on the
    synthetic voices; recordings of people (:mod:`jobs.speech_human`, test split only) are
    reported apart under ``human`` (``cer_human_fp32``, ``cer_human_int8``): a model trained on
    synthetic speech is expected to do far worse on them, and mixing the two would make the
    headline depend on how many such clips a partition happens to hold."""
    from cascade.audio_features import HUMAN_VOICE_PREFIX

    float_artifact = load_artifact(fp32)
    everything = load_split(corpus, split, float_artifact.alphabet)
    is_human = [v.startswith(HUMAN_VOICE_PREFIX) for v in everything.voices]
    data = everything.subset([not h for h in is_human])
    human = everything.subset(is_human)
    if len(data) == 0:
        raise ValueError(f"split {split!r} of {corpus} has no synthetic utterances")
    if data.n_mels != float_artifact.n_mels:
        raise ValueError(
            f"the corpus has {data.n_mels} mel bins, the model expects {float_artifact.n_mels}"
        )
    result: dict[str, Any] = {
        "split": split,
        "utterances": len(data),
        "voices": len(set(data.voices)),
        "fp32": evaluate_model(float_artifact.model, float_artifact, data, beam=beam),
    }
    result["cer_fp32"] = result["fp32"]["greedy"]["cer"]
    result["wer_fp32"] = result["fp32"]["greedy"]["wer"]
    if int8 is not None:
        quant_artifact = load_artifact(int8)
        result["int8"] = evaluate_model(int8_model(quant_artifact), quant_artifact, data, beam=beam)
        result["cer_int8"] = result["int8"]["greedy"]["cer"]
        result["wer_int8"] = result["int8"]["greedy"]["wer"]
        result["int8_cer_delta"] = 100.0 * (result["cer_int8"] - result["cer_fp32"])
    if len(human):
        result["human"] = {"utterances": len(human)}
        models = [("fp32", float_artifact.model, float_artifact)]
        if int8 is not None:
            models.append(("int8", int8_model(quant_artifact), quant_artifact))
        for kind, model, artifact in models:
            report = evaluate_model(model, artifact, human, beam=0)
            result["human"][kind] = report
            result[f"cer_human_{kind}"] = report["greedy"]["cer"]
            result[f"wer_human_{kind}"] = report["greedy"]["wer"]
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
    if "human" in result:
        rates = ", ".join(
            f"{kind} CER {result[f'cer_human_{kind}']:.2%}"
            for kind in ("fp32", "int8")
            if f"cer_human_{kind}" in result
        )
        lines.append(f"people's recordings ({result['human']['utterances']}): {rates}")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, required=True, help="fp32 artifact (dir or .pt)")
    parser.add_argument("--int8", type=Path, default=None, help="RSQ int8 artifact")
    parser.add_argument("--corpus", type=Path, required=True)
    parser.add_argument("--split", default="test", choices=("train", "dev", "test"))
    parser.add_argument("--beam", type=int, default=0)
    parser.add_argument("--out", type=Path, default=None, help="write the full report here")
    args = parser.parse_args(argv)
    result = evaluate_artifacts(
        args.model, args.int8, args.corpus, split=args.split, beam=args.beam
    )
    print("\n".join(summary_lines(result)))
    if args.out is not None:
        args.out.write_text(json.dumps(result, indent=2, ensure_ascii=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
