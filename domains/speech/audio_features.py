"""Audio features shared by the speech corpus job, the ASR trainer, its compiler and its server:
WAV decoding, resampling to 16 kHz, log-mel filterbank features, the transcript normalization,
and the settings that bound all of them (:class:`CorpusConfig`).

No Spark here: :mod:`jobs.audio_corpus` runs these on the executors, the server on each request,
so serving hears what training heard.

The transcript normalization (:func:`normalize_transcript`, :data:`NORMALIZATION` names it) is
the only language-neutral rule applied to text; the model's output alphabet is then fitted from
the normalized training transcripts (:meth:`models.asr.model.Alphabet.fit`), nothing about a
language's letters is written down here. In order:

1. Unicode NFKC (compatibility composition): full-width and other compatibility forms become
   their plain characters (``Ａ`` -> ``A``, ``２`` -> ``2``, ``ﬁ`` -> ``fi``), and a letter with
   a combining accent becomes one precomposed character where Unicode has one (``e`` + U+0301 ->
   ``é``).
2. Lower case with Python's full Unicode mapping (:meth:`str.lower`, not ``casefold``: German
   ``ß`` stays ``ß``, Greek final ``ς`` stays distinct), then NFKC again.
3. Kept as characters: every letter, combining mark and number (Unicode categories ``L*``,
   ``M*``, ``N*``), so any script and the digits ``0-9`` survive; typographic apostrophes
   (``’ ʼ ‘``) become ``'``, kept only between two kept characters (``don't``, ``l'été``).
4. Everything else (punctuation, symbols, controls, quotes, hyphens) becomes a space; whitespace
   runs collapse to one space, trimmed.

A transcript with nothing left is empty text (quarantined by the corpus job); any other
transcript is kept, whatever its script.
"""

from __future__ import annotations

import io
import math
import unicodedata
import wave
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

MANDARIN_PHRASES = (
    "你好", "谢谢", "请", "打开", "关闭", "音乐", "电灯", "今天", "明天", "天气", "下雨", "晴天",
    "一", "二", "三", "四", "五", "六", "七", "八", "九", "十", "上", "下", "左", "右", "是", "不",
    "电话", "消息", "火车", "车站", "时间", "分钟", "小时", "咖啡", "茶", "水", "苹果", "新闻",
)  # fmt: skip
"""Mandarin phrases the synthetic corpus speaks (:mod:`jobs.speech_synth`)."""
HUMAN_VOICE_PREFIX = "human-"
"""Voice names of real people's recordings (:mod:`jobs.speech_human`): evaluation-only, the
corpus always puts them in the test split."""

SAMPLE_RATE = 16_000
NORMALIZATION = "nfkc-lower-letters-marks-numbers/1"
"""Names the transcript normalization above; a fitted alphabet records it, so a model says
which normalization its characters come from."""
LANGUAGE_NAMES = {
    "en": "english", "cmn": "mandarin", "zh": "mandarin", "fr": "french", "es": "spanish",
    "ca": "catalan", "ro": "romanian", "da": "danish", "nl": "dutch", "lt": "lithuanian",
    "ru": "russian", "bg": "bulgarian", "be": "belarusian", "el": "greek",
}  # fmt: skip
"""Names of the languages of the bundled recordings, by ISO 639 code: how their corpus tags
are grouped (``cmn`` and ``zh`` are one language). Any other code is its own group."""


def language_group(language: str) -> str:
    """The language a corpus tag or a request names: ``english`` for ``en`` and every English
    accent (``en-us``, ``en-gb-x-rp``), ``mandarin`` for ``cmn``/``zh`` codes, ``french`` for
    ``fr``/``fr-ca`` and so on (:data:`LANGUAGE_NAMES`), the names themselves; any other tag is
    its primary subtag lower-cased (``cs-CZ`` -> ``cs``, ``de_AT`` -> ``de``)."""
    code = language.strip().lower().replace("_", "-")
    if code in LANGUAGE_NAMES.values():
        return code
    primary = code.split("-")[0]
    return LANGUAGE_NAMES.get(primary, primary)


_APOSTROPHES = str.maketrans({"’": "'", "ʼ": "'", "‘": "'"})
_KEPT = ("L", "M", "N")
"""Unicode general categories (first letter) of the characters a transcript keeps."""


def normalize_transcript(text: str) -> str:
    """The transcript normalization of this module's docstring: NFKC, lower case, letters, marks
    and numbers kept in any script, apostrophes kept inside words, the rest a space."""
    text = unicodedata.normalize("NFKC", unicodedata.normalize("NFKC", text).lower())
    text = text.translate(_APOSTROPHES)
    kept = [unicodedata.category(c)[0] in _KEPT for c in text]
    out = []
    for i, char in enumerate(text):
        if kept[i]:
            out.append(char)
        elif char == "'" and 0 < i < len(text) - 1 and kept[i - 1] and kept[i + 1]:
            out.append(char)
        else:
            out.append(" ")
    return " ".join("".join(out).split())


MIN_SECONDS = 0.3
"""Shortest utterance anywhere: the corpus job quarantines shorter audio, the ASR server refuses
it (400), and the compiled ASR package's frame range starts below it
(:data:`models.asr.compiled.MIN_FRAMES`), so whatever the server takes fits the package."""
STREAMED_DATA_SIZE = 0x7FFF0000
"""A ``data`` chunk declaring at least this many bytes is a streaming placeholder (espeak-ng
``--stdout`` and many recorders write ``0x7ffff000`` or ``0xffffffff`` before they know the
length): its frames are whatever follows the header. A smaller declared size is a promise, and a
file holding less than it is truncated."""


@dataclass(frozen=True, kw_only=True)
class CorpusConfig:
    """Checks and feature settings of the corpus job."""

    rates: tuple[int, ...] = (8_000, 16_000, 22_050, 24_000, 44_100, 48_000)
    """Accepted input sample rates (resampled to 16 kHz); anything else is quarantined."""
    min_seconds: float = MIN_SECONDS
    max_seconds: float = 20.0
    min_chars_per_s: float = 1.0
    """Speaking-rate floor (transcript characters per second of audio): slower is misaligned."""
    max_chars_per_s: float = 30.0
    clip_share: float = 0.01
    """A file with more than this share of samples at full scale is clipped."""
    n_mels: int = 40
    dev_share: float = 0.1
    test_share: float = 0.1
    people_train_voices: tuple[str, ...] = tuple(
        f"{HUMAN_VOICE_PREFIX}tuxpaint-{code}"
        for code in ("fr", "es", "ro", "ru", "bg", "el", "da", "nl", "lt")
    )
    """People (voices named ``human-...``) whose recordings train the model; every other
    person's recordings are test-only, so the test split's people are speakers no training
    utterance used. Tux Paint has one reader per language (:mod:`jobs.speech_human`): by default
    the English, Catalan and Belarusian readers are held out."""
    shards: int = 4
    """Least number of write tasks; each writes one parquet file per split it holds."""
    rows_per_shard: int = 4000
    """More write tasks as the corpus grows: about this many utterances (~50 MB of features)
    per task, so no task holds a whole split."""

    def __post_init__(self) -> None:
        if not 0 < self.min_seconds < self.max_seconds:
            raise ValueError("need 0 < min_seconds < max_seconds")
        if not 0 <= self.dev_share + self.test_share < 1:
            raise ValueError("dev_share + test_share must be in [0, 1)")
        if self.n_mels < 8 or self.shards < 1 or self.rows_per_shard < 1:
            raise ValueError("n_mels must be >= 8, shards and rows_per_shard >= 1")

    def write_tasks(self, rows: int) -> int:
        return max(self.shards, -(-rows // self.rows_per_shard))


class WavError(ValueError):
    """What is wrong with a WAV file. ``kind`` is a short, stable name that the corpus job counts
    and the server's status follows: ``empty`` (no bytes), ``unreadable`` (not RIFF/WAVE),
    ``truncated header`` (the file ends before its ``data`` chunk starts), ``unsupported`` (a
    format the decoder does not take) or ``truncated`` (less data than the header declares);
    ``detail`` says what exactly."""

    def __init__(self, kind: str, detail: str) -> None:
        super().__init__(f"{kind}: {detail}")
        self.kind = kind
        self.detail = detail


@dataclass(frozen=True)
class WavHeader:
    """The format of a WAV file and where its samples are, read without decoding them."""

    channels: int
    width: int
    """Bytes per sample."""
    rate: int
    data_start: int
    """Offset of the first sample byte."""
    declared_frames: int
    frames: int
    """Frames to decode: the declared count, or what follows the header of a streamed file."""
    streamed: bool
    """The ``data`` size is a placeholder (:data:`STREAMED_DATA_SIZE`)."""


def _data_chunk(content: bytes) -> tuple[int, int]:
    """``(offset of the first sample byte, declared data size)``; WavError naming where the
    header is cut when the file ends before its ``data`` chunk starts."""
    size = len(content)
    if size < 12:
        raise WavError(
            "truncated header", f"the file ends after {size} bytes, inside the 12-byte RIFF header"
        )
    position = 12
    while True:
        if position + 8 > size:
            raise WavError(
                "truncated header",
                f"the file ends after {size} bytes, before its 'data' chunk (the chunk header "
                f"at byte {position} needs 8 bytes)",
            )
        chunk = content[position : position + 4]
        length = int.from_bytes(content[position + 4 : position + 8], "little")
        if chunk == b"data":
            return position + 8, length
        if position + 8 + length > size:
            name = chunk.decode("latin-1")
            raise WavError(
                "truncated header",
                f"the file ends after {size} bytes, inside the {name!r} chunk (bytes "
                f"{position}-{position + 8 + length} of the header)",
            )
        position += 8 + length + (length & 1)


def read_wav_header(content: bytes) -> WavHeader:
    """The header of a WAV file, checked against the bytes that follow it; WavError otherwise."""
    if not content:
        raise WavError("empty", "the file holds no bytes")
    if not (b"RIFF".startswith(content[:4]) and b"WAVE".startswith(content[8:12])):
        raise WavError("unreadable", f"not a RIFF/WAVE file (starts with {content[:12]!r})")
    data_start, data_size = _data_chunk(content)
    try:
        with wave.open(io.BytesIO(content)) as read:
            channels, width, rate = read.getnchannels(), read.getsampwidth(), read.getframerate()
    except wave.Error as exc:  # float or compressed samples, a broken fmt chunk
        raise WavError("unsupported", str(exc) or "broken fmt chunk") from None
    except EOFError:
        raise WavError("truncated header", "the fmt chunk ends early") from None
    if channels < 1 or width < 1 or rate < 1:
        raise WavError("unsupported", f"{channels} channels, {width}-byte samples at {rate} Hz")
    block = channels * width
    present = max(0, len(content) - data_start) // block
    declared = data_size // block
    streamed = data_size >= STREAMED_DATA_SIZE
    if present < declared and not streamed:
        raise WavError(
            "truncated",
            f"the data chunk holds {present} of the {declared} frames its header declares "
            f"({present / rate:.3f} of {declared / rate:.3f} s)",
        )
    return WavHeader(
        channels=channels,
        width=width,
        rate=rate,
        data_start=data_start,
        declared_frames=declared,
        frames=present if streamed else declared,
        streamed=streamed,
    )


def decode_wav(content: bytes) -> tuple[np.ndarray, int]:
    """``(float32 mono samples in [-1, 1], rate)``; :class:`WavError` naming what is wrong."""
    header = read_wav_header(content)
    if header.width != 2:
        raise WavError("unsupported", f"sample width {8 * header.width} bits (16-bit PCM expected)")
    end = header.data_start + header.frames * header.channels * 2
    samples = np.frombuffer(content[header.data_start : end], dtype="<i2")
    if header.channels > 1:
        samples = samples.reshape(-1, header.channels).mean(axis=1)
    return samples.astype(np.float32) / 32768.0, header.rate


def encode_wav(samples: np.ndarray, rate: int = SAMPLE_RATE) -> bytes:
    """A 16-bit mono WAV file of float ``samples`` in [-1, 1] (clipped), the inverse of
    :func:`decode_wav` up to quantization."""
    pcm = (np.clip(samples, -1, 1) * 32767).astype("<i2")
    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(rate)
        out.writeframes(pcm.tobytes())
    return buffer.getvalue()


def resample(samples: np.ndarray, rate: int, target: int = SAMPLE_RATE) -> np.ndarray:
    """Polyphase resampling to ``target`` (exact rational ratio)."""
    if rate == target:
        return samples
    from scipy.signal import resample_poly

    g = math.gcd(rate, target)
    return resample_poly(samples, target // g, rate // g).astype(np.float32)


def mel_filterbank(n_mels: int, n_fft: int, rate: int = SAMPLE_RATE) -> np.ndarray:
    """``[n_mels, n_fft // 2 + 1]`` triangular filters evenly spaced on the mel scale."""

    def mel(hz: np.ndarray) -> np.ndarray:
        return 2595.0 * np.log10(1.0 + hz / 700.0)

    def hz(m: np.ndarray) -> np.ndarray:
        return 700.0 * (10.0 ** (m / 2595.0) - 1.0)

    edges = hz(np.linspace(mel(np.array(20.0)), mel(np.array(rate / 2)), n_mels + 2))
    bins = np.fft.rfftfreq(n_fft, 1.0 / rate)
    lower, centre, upper = edges[:-2, None], edges[1:-1, None], edges[2:, None]
    rising = (bins[None, :] - lower) / (centre - lower)
    falling = (upper - bins[None, :]) / (upper - centre)
    return np.clip(np.minimum(rising, falling), 0.0, None).astype(np.float32)


def log_mel(samples: np.ndarray, n_mels: int, rate: int = SAMPLE_RATE) -> np.ndarray:
    """``[frames, n_mels]`` log-mel energies: 25 ms Hann windows every 10 ms."""
    win, hop, n_fft = int(0.025 * rate), int(0.010 * rate), 512
    if len(samples) < win:
        samples = np.pad(samples, (0, win - len(samples)))
    frames = 1 + (len(samples) - win) // hop
    index = np.arange(win)[None, :] + hop * np.arange(frames)[:, None]
    spectrum = np.abs(np.fft.rfft(samples[index] * np.hanning(win), n=n_fft)) ** 2
    return np.log(spectrum @ mel_filterbank(n_mels, n_fft, rate).T + 1e-6).astype(np.float32)


def features_of(row: dict[str, Any] | pd.Series, n_mels: int) -> np.ndarray:
    """The ``[num_frames, n_mels]`` float32 features stored in a corpus row."""
    return np.frombuffer(row["features"], dtype=np.float16).reshape(-1, n_mels).astype(np.float32)
