"""Benchmark of the ASR path: corpus job throughput, CER/WER fp32 vs int8, real-time factors.

    cascade bench asr --out bench-results/asr.json [--model MODEL_DIR] [--quick]
    CASCADE_BENCH_ASR_SIZES=2000,10000 cascade bench asr --model MODEL_DIR --out FILE

In one process, on one Spark session (``settings.spark_master``, ``local[2]`` by default):

1. **Corpus job** (:func:`jobs.audio_corpus.build_corpus`) at each size of
   ``CASCADE_BENCH_ASR_SIZES`` (default 10,000 and 100,000 utterances; ``--quick`` 200):
   ``utterances_per_s`` = utterances in / seconds of the build (decode, validate, resample,
   featurize, split, write). The landing batch is ``min(size, CASCADE_BENCH_ASR_UNIQUE)``
   distinct espeak-ng utterances (default 2,000: synthesis is the slow part and is not the
   job being measured), repeated under new utterance ids (hard links) up to the size; each
   repeat is decoded and featurized like any other file. The smallest size's corpus is the
   evaluation corpus.
2. **Model**: ``--model`` (``CASCADE_BENCH_ASR_MODEL``), a folder with ``asr_model.pt`` or a
   training's output folder (``fp32/`` and ``int8/``); without it
   :func:`models.asr.train.train_asr` trains the ``CASCADE_BENCH_ASR_CONFIG`` config (default
   ``fast`` with ``--quick``, minutes; else ``people``, about an hour on 2 cores) on that corpus,
   after printing an estimate of its duration
   (:func:`benchmarks.asr_model.estimate_training_s`: a few fp32 and QAT steps timed here,
   times the config's steps; ``train_estimate_s``) on stderr, and reporting its progress as
   it goes. ``model_digest`` is the digest of the model files (trained or
   given); ``model_provenance`` names the config, the training corpus's digest, ``train_s`` and
   the estimate; ``training_corpus`` is that corpus (folder, utterance counts per split,
   ``files_digest`` of the folder).
3. **Compile** (:func:`compilers.asr.compile_asr`): fp32 and int8 AOTInductor packages and the
   ONNX file, each run on 21 lengths from ``MIN_SECONDS`` (0.3 s) to 20 s (``shapes_tried``).
   Measured, per variant (``recompiles_by_variant``): a package's ``compiles`` are the packages
   loaded to serve every length (another is loaded only when one fails a length) and
   ``shapes_served`` the lengths it ran; ``recompiles`` (top level) is the packages' largest
   loads - 1, 0 when one package served every length (a length none serves fails the
   benchmark). ``recompiles_torch_compile_dynamic`` is Dynamo's graph count - 1 for in-process
   ``torch.compile(dynamic=True)``: its convolution backend choice guards on the length
   (<= 512, <= 1280 frames), so it compiles three graphs where export needs one. The peers:
   ``inductor`` (Inductor's defaults), ``inductor_tuned`` (freezing, the C++ wrapper, and
   max-autotune where it measured faster: ``inductor_tuned_options``), ``onnxruntime`` (the fp32
   ONNX file), ``onnxruntime_int8`` (ONNX Runtime's dynamic quantizer on that file:
   ``onnxruntime_int8_quantization``) and ``eager_int8`` (PyTorch's dynamic int8 ``nn.Linear``:
   ``eager_int8_quantization``).
4. **Accuracy** on the corpus test split (held-out voices): ``cer_fp32``, ``wer_fp32`` (eager),
   ``cer_int8``, ``wer_int8`` (the int8 package), ``cer_delta`` = int8 - fp32 in points; each
   utterance decoded for its own language (the corpus row's, as a request naming it is served).
   People: when Debian's Tux Paint stamps are installed (:mod:`jobs.speech_human`), their
   recordings of people become a second corpus (same Spark session) and ``cer_people_fp32`` /
   ``cer_people_int8`` are its CER; without them both are null and ``people_reason`` says why.
   ``cer_by_language``: fp32 CER per language over synthetic and people utterances together;
   ``foreign_tokens``: characters outside the utterance's language in the int8 package's
   transcriptions (``foreign_tokens_unrestricted``: the same decoded without a language).
   ``train_s``: seconds of the training this run did (null with ``train_s_reason`` when
   ``--model`` was given).
   **Recorded people** (:mod:`benchmarks.asr_people`): the Debian package sources
   ``asterisk_en``, ``fillets_cs`` and ``fillets_nl`` (``CASCADE_BENCH_ASR_CLIPS`` clips each;
   a few with ``--quick``, else all) in one corpus, split by speaker and by sentence; their
   training part joins the training corpus (a config with ``train_people=False`` leaves it out:
   ``human_trained``). ``cer_seen_speakers`` (held-out sentences of speakers heard in
   training), ``cer_unseen_speakers_by_language`` (held-out speakers, with the training minutes
   and speakers each language had), ``human_train_minutes_by_language``. **The English peer**:
   PocketSphinx's en-us model and the model (the int8 package, else eager fp32) on the same
   English test clips (synthetic, Tux Paint's, the recordings' held-out ones), WAV bytes in:
   ``pocketsphinx_cer_en``, ``cer_en``, ``rtf_pocketsphinx_en``, ``rtf_en_end_to_end``.
   **Language without an oracle** (:mod:`benchmarks.asr_language`): a language identifier
   fitted on the training split picks each test utterance's decoding alphabet:
   ``language_id_accuracy``, ``cer_by_language_detected`` beside ``cer_by_language_oracle``
   (the label's, same utterances), ``cer_fp32_detected`` beside ``cer_fp32``.
   **Goals** (:data:`benchmarks.goals.GOALS`, each with its ``*_goal_met``, null when the run
   lacks the figure): ``cer_seen_speakers_median`` (the seen-speaker CER's median over the
   languages with at least 60 training minutes: ``cer_seen_speakers_goal_languages``),
   ``cer_en_over_pocketsphinx``, ``cer_fp32_detected``, ``cer_delta`` and
   ``language_id_accuracy``.
5. **Real-time factor**: compute seconds / audio seconds of a greedy transcription
   (forward pass + CTC decoding, features given) for utterances of 1, 2, 5, 10 and 20 s made of
   test-split audio; every variant (eager fp32, fp32 package, int8 package, Inductor default and
   tuned, ONNX Runtime fp32 and int8, eager int8) runs each utterance in turn, round by round
   (order rotating), and the median per utterance is kept. ``rtf_*`` is the median over
   rounds of a round's seconds over the sum of audio seconds; ``rtf_int8_end_to_end`` adds WAV
   decoding, resampling and log-mel features to the int8 package. Torch and ONNX Runtime use
   ``CASCADE_BENCH_ASR_THREADS`` intra-op threads (default 2: the target machine's cores).
   Rounds and repeats per round follow ``--repeats`` (default 5, 3 with ``--quick``).

6. **The compile benchmark's keys**, at the 20 s utterance: ``{variant}_ms`` (and ``_ms_runs``,
   one per round) for ``eager``, ``inductor``, ``inductor_tuned``, ``onnxruntime``,
   ``cascade`` (the fp32 package; ``cascade_fp32_ms`` is the same figure under its old name),
   ``cascade_int8`` (the int8 package), ``onnxruntime_int8`` and ``eager_int8``. Ratios, fp32
   against fp32: ``speedup_vs_{eager,inductor,inductor_tuned,onnxruntime}`` = ``{peer}_ms /
   cascade_ms``; int8 against int8: ``int8_speedup_vs_{onnxruntime_int8,eager_int8}`` =
   ``{peer}_ms / cascade_int8_ms``; ``int8_speedup_vs_{eager,inductor,onnxruntime}`` divide
   the fp32 peers by the int8 package (compilation and quantization together), as do
   ``speedup_int8_vs_eager`` / ``speedup_int8_vs_onnxruntime`` (real-time factors, every
   length).
``CASCADE_BENCH_ASR_SKIP`` leaves parts out, for smoke runs: ``compile`` (step 3, the int8
figures and every variant but eager fp32) and ``people``; ``skipped`` names each part left out
and why, and the figures it would have made are null.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch

from benchmarks.asr_model import corpus_record, obtain_model, training_config_name
from benchmarks.asr_people import Recordings
from benchmarks.goals import goal, goals_met
from benchmarks.provenance import bench_repeats, files_digest, rotated
from cascade.config import load_settings
from cascade.progress import track
from compilers.timing import median_seconds

FULL_SIZES = (10_000, 100_000)
QUICK_SIZES = (200,)
SKIP_REASONS = {
    "compile": "CASCADE_BENCH_ASR_SKIP=compile: no AOTInductor packages, ONNX Runtime or "
    "Inductor (their C++ builds take minutes); only the eager fp32 model is measured",
    "people": "CASCADE_BENCH_ASR_SKIP=people: the Tux Paint people corpus is not built",
    "recordings": "CASCADE_BENCH_ASR_SKIP=recordings: the recorded speech of the Debian package "
    "sources is not landed (no seen/unseen speaker figures, no recordings in training)",
}
"""Why each part of ``CASCADE_BENCH_ASR_SKIP`` is missing from a result."""
DURATIONS_S = (1.0, 2.0, 5.0, 10.0, 20.0)
REPEAT_SUFFIX = r"-repeat\d+$"


def bench_sizes(quick: bool) -> tuple[int, ...]:
    sizes = load_settings().bench.asr_sizes
    if sizes:
        return tuple(sorted(sizes))
    return QUICK_SIZES if quick else FULL_SIZES


def replicate_landing(source: Path, target: Path, size: int) -> int:
    """A landing folder of ``size`` utterances: ``source``'s, then repeats under new ids."""
    rows = [json.loads(line) for line in (source / "transcripts.jsonl").read_text().splitlines()]
    (target / "wav").mkdir(parents=True, exist_ok=True)
    lines = []
    for index in range(size):
        row = dict(rows[index % len(rows)])
        original = row["utterance_id"]
        row["utterance_id"] = original if index < len(rows) else f"{original}-repeat{index}"
        os.link(source / "wav" / f"{original}.wav", target / "wav" / f"{row['utterance_id']}.wav")
        lines.append(json.dumps(row, ensure_ascii=False, sort_keys=True))
    (target / "transcripts.jsonl").write_text("".join(line + "\n" for line in lines))
    return size


def corpus_throughput(
    spark: Any, work: Path, sizes: tuple[int, ...], unique: int
) -> tuple[list[dict[str, Any]], Path, Path]:
    """Time the corpus build at each size; returns results, the eval corpus and its landing."""
    from jobs.audio_corpus import build_corpus, land_synthetic

    landing = work / "landing-unique"
    count = min(max(sizes), unique)
    start = time.perf_counter()
    land_synthetic(spark, landing, count=count)
    land_s = time.perf_counter() - start
    print(f"[bench asr] landed {count} utterances in {land_s:.1f} s", flush=True)
    results = []
    evaluation = None
    for size in sizes:
        sized = work / f"landing-{size}"
        replicate_landing(landing, sized, size)
        out = work / f"corpus-{size}"
        start = time.perf_counter()
        summary = build_corpus(spark, sized, out)
        build_s = time.perf_counter() - start
        results.append(
            {
                "utterances": size,
                "distinct_utterances": min(size, count),
                "build_s": build_s,
                "utterances_per_s": size / build_s,
                "kept": summary["utterances"],
                "quarantined": summary["quarantined"],
            }
        )
        print(f"[bench asr] corpus of {size}: {size / build_s:.1f} utterances/s", flush=True)
        if evaluation is None:
            evaluation = out
        if sized != landing:
            shutil.rmtree(sized, ignore_errors=True)
    assert evaluation is not None
    return results, evaluation, landing


def held_out_split(corpus: Path, n_mels: int, limit: int | None) -> pd.DataFrame:
    """The corpus test split (held-out voices) with float32 features in column ``x``."""
    from domains.speech.audio_features import features_of

    frame = pd.read_parquet(corpus / "shards" / "split=test").sort_values("utterance_id")
    # Repeats made by replicate_landing would count one utterance several times.
    frame = frame[~frame["utterance_id"].str.contains(REPEAT_SUFFIX, regex=True)]
    if limit is not None:
        frame = frame.head(limit)
    frame = frame.assign(x=[features_of(row, n_mels) for _, row in frame.iterrows()])
    return frame


def error_rates(
    forward: Any, alphabet: Any, frame: pd.DataFrame, language_models: Any = None
) -> dict[str, Any]:
    """CER/WER of ``forward`` on ``frame``, each utterance decoded for its own language (when
    the alphabet knows it) with that language's n-gram from ``language_models`` when there is
    one (``cer``, ``wer``) and greedily (``cer_greedy``), with the transcripts and how many
    output characters fall outside the utterance's language, restricted and not (one forward
    pass serves all)."""
    from models.asr.compiled import MIN_FRAMES
    from models.asr.evaluate import decoding_language
    from models.asr.inference import decode, log_probs_of
    from models.asr.metrics import cer, wer

    usable = frame[[len(x) >= MIN_FRAMES for x in frame["x"]]]
    refs, languages = list(usable["transcript"]), list(usable["language"])
    hyps, greedy, foreign, foreign_plain = [], [], 0, 0
    subsample = forward.config.subsample
    for x, language in zip(usable["x"], languages, strict=True):
        log_probs = log_probs_of(forward, x)
        lang = decoding_language(alphabet, language, True)
        greedy.append(decode(log_probs, alphabet, subsample, language=lang).text)
        text = (
            decode(
                log_probs, alphabet, subsample, language=lang, language_models=language_models
            ).text
            if language_models is not None and lang is not None
            else greedy[-1]
        )
        plain = decode(log_probs, alphabet, subsample).text
        hyps.append(text)
        foreign += alphabet.foreign_tokens(text, language)
        foreign_plain += alphabet.foreign_tokens(plain, language)
    return {
        "cer": cer(refs, hyps),
        "wer": wer(refs, hyps),
        "cer_greedy": cer(refs, greedy),
        "decoding": "n-gram beam search" if language_models is not None else "greedy",
        "utterances": len(refs),
        "foreign_tokens": foreign,
        "foreign_tokens_unrestricted": foreign_plain,
        # Reference characters the model has no output for (never in its training transcripts).
        "unseen_characters": sum(sum(alphabet.unseen(r).values()) for r in refs),
        "references": refs,
        "hypotheses": hyps,
        "greedy_hypotheses": greedy,
        "languages": languages,
    }


def cer_by_language(*rates: dict[str, Any]) -> dict[str, float]:
    """CER per language (:func:`~domains.speech.audio_features.language_group`) over ``rates``'
    transcripts together."""
    from domains.speech.audio_features import language_group
    from models.asr.metrics import cer

    pairs: dict[str, tuple[list[str], list[str]]] = {}
    for part in rates:
        for ref, hyp, language in zip(
            part["references"], part["hypotheses"], part["languages"], strict=True
        ):
            refs, hyps = pairs.setdefault(language_group(language), ([], []))
            refs.append(ref)
            hyps.append(hyp)
    return {group: cer(refs, hyps) for group, (refs, hyps) in sorted(pairs.items())}


def people_corpus(spark: Any, work: Path) -> tuple[Path | None, str | None]:
    """A corpus of Tux Paint's recordings of people, or ``(None, why not)``."""
    from jobs import speech_human
    from jobs.audio_corpus import build_corpus

    root = speech_human.STAMPS_ROOT
    if not root.is_dir() or not speech_human.english_clips(root):
        return None, (
            f"no people corpus: no Tux Paint stamp recordings under {root} "
            "(Debian package tuxpaint-stamps-default, infra/install.sh)"
        )
    landing = work / "landing-people"
    speech_human.land_human(landing, root)
    out = work / "corpus-people"
    summary = build_corpus(spark, landing, out)
    if not summary["utterances"]:
        return None, f"no people corpus: every recording was quarantined ({summary})"
    return out, None


def long_utterances(landing: Path, frame: pd.DataFrame) -> list[tuple[float, bytes]]:
    """WAV files of each of :data:`DURATIONS_S` made by chaining test-split audio."""

    from domains.speech.audio_features import SAMPLE_RATE, decode_wav, encode_wav, resample

    audio = []
    for utterance_id in frame["utterance_id"]:
        samples, rate = decode_wav((landing / "wav" / f"{utterance_id}.wav").read_bytes())
        audio.append(resample(samples, rate))
    chain = np.concatenate(audio) if audio else np.zeros(SAMPLE_RATE, np.float32)
    while len(chain) < DURATIONS_S[-1] * SAMPLE_RATE:
        chain = np.concatenate([chain, chain])
    files = []
    for seconds in DURATIONS_S:
        files.append((seconds, encode_wav(chain[: int(seconds * SAMPLE_RATE)], SAMPLE_RATE)))
    return files


def real_time_factors(
    variants: dict[str, Callable[[Any], Any]],
    utterances: list[tuple[float, Any]],
    *,
    rounds: int,
    repeats: int,
) -> dict[str, Any]:
    """Per variant, interleaved round by round (the variants' order rotating each round):
    ``rtf_runs``, each round's real-time factor (its seconds over all utterances / their audio
    seconds), ``rtf`` their median, and per length the median milliseconds."""
    samples: dict[str, dict[float, list[float]]] = {
        name: {seconds: [] for seconds, _ in utterances} for name in variants
    }
    for round_ in track(range(rounds), desc="bench asr rounds", unit="rounds"):
        for seconds, item in utterances:
            for name in rotated(list(variants), round_):
                call = functools.partial(variants[name], item)
                samples[name][seconds].append(median_seconds(call, repeats=repeats, warmup=1))
    total_audio = sum(seconds for seconds, _ in utterances)
    result: dict[str, Any] = {}
    for name, per_length in samples.items():
        medians = {seconds: statistics.median(values) for seconds, values in per_length.items()}
        runs = [sum(v[r] for v in per_length.values()) / total_audio for r in range(rounds)]
        result[name] = {
            # The median round, so the figure lies within its runs (a sum of per-length
            # medians mixes rounds and fell below every round's factor for ONNX Runtime).
            "rtf": statistics.median(runs),
            "rtf_runs": runs,
            "per_length": {
                f"{s:g}s": {
                    "ms": m * 1000,
                    "rtf": m / s,
                    "ms_runs": [v * 1000 for v in per_length[s]],
                }
                for s, m in medians.items()
            },
        }
    return result


ASR_PEERS = ("inductor_tuned", "onnxruntime_int8", "eager_int8")
"""The ASR model's peers beside eager, Inductor's defaults and ONNX Runtime fp32."""


def asr_peers(
    model: Any,
    n_mels: int,
    onnx_file: Path,
    work: Path,
    *,
    shapes: Sequence[tuple[torch.Tensor, ...]],
    threads: int,
    trial: bool,
    names: tuple[str, ...] = ASR_PEERS,
) -> tuple[dict[str, Callable[..., Any]], dict[str, Any]]:
    """The ASR model's ``names`` peers (:func:`benchmarks.compile_peers.build_peers`;
    ``onnxruntime_int8`` is ONNX Runtime's quantization of the fp32 ``onnx_file``), each a
    forward pass :func:`models.asr.inference.transcribe` accepts, and their report:
    ``inductor_tuned_options`` (max-autotune tried on the longest of ``shapes`` when ``trial``),
    the quantizers' ``*_quantization``, ``compile_s`` and ``inductor_tuned_recompiles``."""
    from benchmarks.compile_peers import build_peers
    from benchmarks.compiled_inference import peer_report
    from compilers.asr import asr_example
    from models.asr.compiled import onnxruntime_asr

    peers = build_peers(
        model,
        asr_example(n_mels),
        work,
        names=names,
        shapes=shapes,
        dynamic_shapes=None,
        input_names=(),
        trial_inputs=shapes[-1] if trial else None,
        onnx_file=onnx_file,
    )
    report = peer_report(peers)
    report["compile_s"] = {name: peer.compile_s for name, peer in peers.items()}
    if "inductor_tuned" in peers:
        report["inductor_tuned_recompiles"] = peers["inductor_tuned"].recompiles
    fns = {name: peer.fn for name, peer in peers.items()}
    if "onnxruntime_int8" in peers:
        # The session behind the same range check and ``config`` as the fp32 one.
        fns["onnxruntime_int8"] = onnxruntime_asr(
            Path(onnx_file).with_suffix(".int8.onnx"), model.config, threads=threads
        )
    return fns, report


COMPILE_BENCH_NAMES = {
    "eager": "eager",
    "inductor": "inductor",
    "inductor_tuned": "inductor_tuned",
    "onnxruntime": "onnxruntime",
    "fp32_artifact": "cascade",
    "int8": "cascade_int8",
    "onnxruntime_int8": "onnxruntime_int8",
    "eager_int8": "eager_int8",
}
"""Variant of the real-time factors -> its name in the compile benchmark (``cascade`` is the
fp32 package, ``cascade_int8`` the int8 one)."""


def compile_bench_keys(timings: dict[str, Any]) -> dict[str, Any]:
    """The compile benchmark's keys from :func:`real_time_factors`' result, at the longest
    utterance: ``{name}_ms`` and ``{name}_ms_runs`` per :data:`COMPILE_BENCH_NAMES`,
    ``cascade_fp32_ms`` (= ``cascade_ms``), and the ratios of
    :func:`benchmarks.compiled_inference.speedups`: fp32 peers over the fp32 package, int8
    peers over the int8 package."""
    from benchmarks.compiled_inference import speedups

    longest = f"{DURATIONS_S[-1]:g}s"
    keys: dict[str, Any] = {}
    ms: dict[str, float] = {}
    for variant, name in COMPILE_BENCH_NAMES.items():
        if variant not in timings:
            continue
        figure = timings[variant]["per_length"][longest]
        ms[name] = keys[f"{name}_ms"] = figure["ms"]
        keys[f"{name}_ms_runs"] = figure["ms_runs"]
    if "cascade" in ms:
        keys["cascade_fp32_ms"] = ms["cascade"]
        keys["cascade_fp32_ms_runs"] = keys["cascade_ms_runs"]
    keys.update(speedups(ms))
    return keys


def run(out: Path, quick: bool) -> dict[str, Any]:
    """``cascade bench asr``: see the module docstring."""
    from benchmarks.compile_peers import RECOMPILE_LIMIT
    from compilers.export import torch_threads

    threads = load_settings().bench.asr_threads
    with torch_threads(threads), torch._dynamo.config.patch(recompile_limit=RECOMPILE_LIMIT):
        return _run(quick, threads)


def _run(quick: bool, threads: int) -> dict[str, Any]:
    from benchmarks.asr_language import language_figures
    from benchmarks.asr_people import (
        land_recordings,
        people_figures,
        recording_clips,
        seen_speakers_median,
        with_recordings,
    )
    from jobs.audio_corpus import spark_session
    from jobs.spark_sessions import active_or_new
    from models.asr.artifact import load_artifact

    settings = load_settings()
    sizes = bench_sizes(quick)
    skipped = {part: SKIP_REASONS[part] for part in settings.bench.asr_skip}
    if not settings.bench.asr_model:
        training_config_name(quick)  # an unknown config fails now, not after the corpus
    work = Path(tempfile.mkdtemp(prefix="cascade-bench-asr-"))
    result: dict[str, Any] = {"quick": quick, "threads": threads, "sizes": {}, "skipped": skipped}
    # A session already running (a caller's, a test's) is used and left running.
    with active_or_new(spark_session) as spark:
        unique = load_settings().bench.asr_unique
        corpus_runs, corpus, landing = corpus_throughput(spark, work, sizes, unique)
        people: Path | None = None
        people_reason: str | None = f"skipped: {skipped['people']}" if "people" in skipped else None
        if "people" not in skipped:
            people, people_reason = people_corpus(spark, work)
        recordings: Recordings | None = None
        recordings_reason: str | None = None
        if "recordings" in skipped:
            recordings_reason = f"skipped: {skipped['recordings']}"
        else:
            recordings, recordings_reason = land_recordings(spark, work, recording_clips(quick))
    for entry in corpus_runs:
        result["sizes"][str(entry["utterances"])] = entry
    result["utterances_per_s"] = corpus_runs[-1]["utterances_per_s"]
    result["utterances_per_s_size"] = corpus_runs[-1]["utterances"]

    # The model trains on the synthetic corpus plus the recordings' training part.
    training = corpus if recordings is None else with_recordings(corpus, recordings, work)
    fp32_dir, int8_dir, provenance = obtain_model(settings, training, work, quick=quick)
    model_files = sorted({fp32_dir / "asr_model.pt", int8_dir / "asr_model.pt"})
    result["model_digest"] = files_digest(model_files)
    provenance["files"] = [str(path) for path in model_files]
    result["model"] = provenance
    result["model_provenance"] = provenance
    result["train_s"] = provenance.get("train_s")
    result["train_estimate_s"] = provenance.get("train_estimate_s")
    result["train_config"] = provenance.get("config")
    if provenance["source"] == "trained":
        distinct = corpus_runs[0]["distinct_utterances"]
        result["training_corpus"] = corpus_record(training, distinct, provenance["corpus_digest"])
    else:
        result["train_s_reason"] = "no training in this run: the model was given (--model)"
        result["training_corpus"] = None
        result["training_corpus_reason"] = (
            "the model was given (--model); model_provenance.training names what its "
            "training wrote, when its result.json is beside it"
        )
    artifact = load_artifact(fp32_dir)
    quantized = load_artifact(int8_dir)
    variants: dict[str, Callable[..., Any]] = {"eager": artifact.model}
    if "compile" in skipped:
        result.update(
            compile_s=None,
            passes=None,
            fp32_passes=None,
            recompiles=None,
            shapes_tried=None,
            recompiles_torch_compile_dynamic=None,
            recompiles_by_variant=None,
        )
    else:
        models = (fp32_dir, int8_dir)
        _compile_variants(
            result, variants, (artifact, quantized), models, corpus, work, threads, quick
        )

    def rates_of(frame: pd.DataFrame) -> tuple[dict[str, Any], dict[str, Any] | None]:
        """The eager fp32 and int8 package rates on ``frame``."""
        int8 = variants.get("int8")
        return (
            error_rates(artifact.model, artifact.alphabet, frame, artifact.language_models),
            None
            if int8 is None
            else error_rates(int8, quantized.alphabet, frame, quantized.language_models),
        )

    def rates_on(source: Path) -> tuple[pd.DataFrame, dict[str, Any], dict[str, Any] | None]:
        """The test split of ``source`` and the eager fp32 and int8 package rates on it."""
        frame = held_out_split(source, artifact.n_mels, 60 if quick else None)
        return (frame, *rates_of(frame))

    from models.asr.config_registry import CONFIGS, get_config

    # A given model's config is known when its training's result.json is beside it.
    config_name = provenance.get("config") or (provenance.get("training") or {}).get("config")
    trained_on_people = get_config(config_name).train_people if config_name in CONFIGS else None
    measured = _measure(
        result, quick, artifact, quantized, variants, rates_on, corpus, people, people_reason,
        landing, work,
    )  # fmt: skip
    parts = measured.pop("_test_parts")
    measured.update(
        people_figures(
            artifact, quantized, variants, rates_of, recordings, recordings_reason,
            trained_on_people, parts,
        )
    )  # fmt: skip
    # The language identifier on every test utterance above (people_figures adds the recordings').
    with torch.inference_mode():
        measured.update(
            language_figures(
                artifact, training, [(name, frame) for name, frame, _ in parts], quick=quick
            )
        )
    measured.update(seen_speakers_median(measured))
    # The RTF goal's key is set with its figure (_measure).
    measured.update(goals_met("asr", measured, skip=measured))
    shutil.rmtree(work, ignore_errors=True)
    return measured


def _compile_variants(
    result: dict[str, Any],
    variants: dict[str, Callable[..., Any]],
    artifacts: tuple[Any, Any],
    model_dirs: tuple[Path, Path],
    corpus: Path,
    work: Path,
    threads: int,
    quick: bool,
) -> None:
    """Step 3: the fp32 and int8 packages, the ONNX file, Inductor (default and tuned) and the
    int8 peers, added to ``variants``; their compile times and recompile counts into
    ``result``."""
    from benchmarks.compiled_inference import served_shapes
    from compilers.asr import compile_asr, corpus_features, count_recompiles
    from models.asr.artifact import artifact_files
    from models.asr.compiled import (
        FP32_FILE,
        INT8_FILE,
        MIN_AUDIO_FRAMES,
        ONNX_FILE,
        frames_for_seconds,
        load_compiled,
        onnxruntime_asr,
    )

    settings = load_settings()
    artifact, quantized = artifacts
    # The float packages come from the float model, the int8 one from the quantized model.
    fp32_compiled, int8_compiled = work / "compiled-fp32", work / "compiled-int8"
    for source, target in zip(model_dirs, (fp32_compiled, int8_compiled), strict=True):
        target.mkdir(parents=True, exist_ok=True)
        for part in artifact_files(source):  # the weights and their vocabulary
            shutil.copy(part, target / part.name)
    calibration = None
    if not (quantized.quantization or {}).get("activation_ranges"):
        calibration = corpus_features(corpus, "train", artifact.n_mels, limit=32)
    cache = settings.home / "compile-cache"
    start = time.perf_counter()
    float_report = compile_asr(fp32_compiled, cache_dir=cache, int8=False)
    int8_report = compile_asr(
        int8_compiled, calibration=calibration, cache_dir=cache, fp32=False, onnx=False
    )
    result["compile_s"] = {
        "total": time.perf_counter() - start,
        "fp32": float_report["fp32"]["compile_s"],
        "int8": int8_report["int8"]["compile_s"],
        "onnx": float_report["onnx"]["export_s"],
    }
    result["passes"] = int8_report["int8"]["passes"]
    result["fp32_passes"] = float_report["fp32"]["passes"]
    config = artifact.model.config
    lengths = sorted(
        {frames_for_seconds(s) for s in np.linspace(1.0, 20.0, 20)} | {MIN_AUDIO_FRAMES}
    )
    shapes = [(torch.randn(1, frames, artifact.n_mels) - 6,) for frames in lengths]
    recompiles: dict[str, dict[str, int]] = {}
    # The deployed packages: each loaded once, unless a length fails on it (served_shapes).
    fp32_package, recompiles["cascade"] = served_shapes(
        lambda: load_compiled(fp32_compiled / FP32_FILE, config), shapes
    )
    int8_package, recompiles["cascade_int8"] = served_shapes(
        lambda: load_compiled(int8_compiled / INT8_FILE, quantized.model.config), shapes
    )
    variants.update(
        {
            "fp32_artifact": fp32_package,
            "int8": int8_package,
            "onnxruntime": onnxruntime_asr(fp32_compiled / ONNX_FILE, config, threads=threads),
        }
    )
    for inputs in shapes:  # one session: a failure is a length it lacks
        variants["onnxruntime"](*inputs)
    result["recompiles"] = max(r["recompiles"] for r in recompiles.values())
    result["shapes_tried"] = len(lengths)
    start = time.perf_counter()
    dynamic, inductor = count_recompiles(artifact.model, artifact.n_mels, lengths)
    result["compile_s"]["inductor"] = time.perf_counter() - start
    result["recompiles_torch_compile_dynamic"] = dynamic["recompiles"]
    recompiles["inductor"] = {
        "compiles": dynamic["compiles"],
        "recompiles": dynamic["recompiles"],
        "shapes": len(lengths),
    }
    variants["inductor"] = inductor
    # The like-for-like peers: Inductor tuned (fp32), ONNX Runtime's and PyTorch's int8.
    peers, report = asr_peers(
        artifact.model,
        artifact.n_mels,
        fp32_compiled / ONNX_FILE,
        work,
        shapes=shapes,
        threads=threads,
        trial=not quick,
    )
    recompiles["inductor_tuned"] = report.pop("inductor_tuned_recompiles")
    result["compile_s"].update(report.pop("compile_s"))
    result.update(report)
    result["recompiles_by_variant"] = recompiles
    variants.update(peers)


def _measure(
    result: dict[str, Any],
    quick: bool,
    artifact: Any,
    quantized: Any,
    variants: dict[str, Callable[..., Any]],
    rates_on: Callable[[Path], tuple[pd.DataFrame, dict[str, Any], dict[str, Any] | None]],
    corpus: Path,
    people: Path | None,
    people_reason: str | None,
    landing: Path,
    work: Path,
) -> dict[str, Any]:
    """Steps 4 and 5: accuracy and real-time factors of ``variants`` (int8 figures null when
    there is no int8 package)."""
    from domains.speech.audio_features import decode_wav, log_mel, resample
    from models.asr.inference import transcribe

    frame, fp32_rates, int8_rates = rates_on(corpus)
    result.update(
        cer_fp32=fp32_rates["cer"],
        wer_fp32=fp32_rates["wer"],
        cer_int8=None if int8_rates is None else int8_rates["cer"],
        wer_int8=None if int8_rates is None else int8_rates["wer"],
        cer_delta=None if int8_rates is None else (int8_rates["cer"] - fp32_rates["cer"]) * 100,
        cer_fp32_greedy=fp32_rates["cer_greedy"],
        decoding=fp32_rates["decoding"],
        test_utterances=fp32_rates["utterances"],
        cer_people_fp32=None,
        cer_people_int8=None,
        people_utterances=0,
        people_reason=people_reason,
    )
    fp32_people = int8_people = None
    result["_test_parts"] = [("synthetic", frame, landing)]
    if people is not None:
        people_frame, fp32_people, int8_people = rates_on(people)
        result["_test_parts"].append(("tuxpaint", people_frame, work / "landing-people"))
        for kind, rates in (("fp32", fp32_people), ("int8", int8_people)):
            if rates is not None:
                result[f"cer_people_{kind}"] = rates["cer"]
                result[f"wer_people_{kind}"] = rates["wer"]
        result["people_utterances"] = fp32_people["utterances"]
    result["cer_by_language"] = cer_by_language(
        *(r for r in (fp32_rates, fp32_people) if r is not None)
    )
    int8_parts = [r for r in (int8_rates, int8_people) if r is not None]
    result["foreign_tokens"] = sum(r["foreign_tokens"] for r in int8_parts)
    result["foreign_tokens_unrestricted"] = sum(
        r["foreign_tokens_unrestricted"] for r in int8_parts
    )

    files = long_utterances(landing, frame)
    features = [(seconds, _features(wav, artifact.n_mels)) for seconds, wav in files]

    def greedy(forward: Any) -> Callable[[Any], Any]:
        return lambda x: transcribe(forward, artifact.alphabet, x)

    int8_forward: Any = variants.get("int8")

    def end_to_end(wav: bytes) -> Any:
        samples, rate = decode_wav(wav)
        features = log_mel(resample(samples, rate), quantized.n_mels)
        return transcribe(int8_forward, quantized.alphabet, features)

    rounds = bench_repeats(5, quick=quick, quick_default=3)
    with torch.inference_mode():
        timings = real_time_factors(
            {name: greedy(fn) for name, fn in variants.items()},
            features,
            rounds=rounds,
            repeats=rounds,
        )
        if int8_forward is not None:
            timings.update(
                real_time_factors(
                    {"int8_end_to_end": end_to_end}, files, rounds=rounds, repeats=rounds
                )
            )
    result["rtf"] = timings
    result["rounds"] = rounds
    result.update(
        {
            f"rtf_{name}": timings[name]["rtf"] if name in timings else None
            for name in (
                "eager",
                "fp32_artifact",
                "int8",
                "onnxruntime",
                "inductor",
                "inductor_tuned",
                "onnxruntime_int8",
                "eager_int8",
                "int8_end_to_end",
            )
        }  # fmt: skip
    )
    # The compile benchmark's keys at the longest utterance: fp32 peers over the fp32 package,
    # int8 peers over the int8 package (compile_bench_keys); null when compile was skipped.
    compiled = "int8" in timings
    keys = compile_bench_keys(timings) if compiled else {}
    for name in ("eager", "inductor", "inductor_tuned", "onnxruntime", "cascade", "cascade_int8"):
        keys.setdefault(f"{name}_ms", None)
    for base in ("eager", "inductor", "inductor_tuned", "onnxruntime"):
        keys.setdefault(f"speedup_vs_{base}", None)
    result.update(keys)
    for name in timings:  # each figure's rounds, for its spread
        result[f"rtf_{name}_runs"] = timings[name]["rtf_runs"]
    result["speedup_int8_vs_eager"] = result["rtf_eager"] / result["rtf_int8"] if compiled else None
    result["speedup_int8_vs_onnxruntime"] = (
        result["rtf_onnxruntime"] / result["rtf_int8"] if compiled else None
    )
    rtf_goal = goal("asr", "rtf_int8")
    result[rtf_goal.key] = rtf_goal.met(result["rtf_int8"]) if compiled else None
    return result


def _features(wav: bytes, n_mels: int) -> np.ndarray:
    from domains.speech.audio_features import decode_wav, log_mel, resample

    samples, rate = decode_wav(wav)
    return log_mel(resample(samples, rate), n_mels)
