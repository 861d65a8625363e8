"""ConvDFSMN with CTC: a Conv1d front end, deep feedforward sequential memory blocks with skip
connections, and a character output layer with a CTC blank.

A DFSMN block (Zhang et al., "Deep-FSMN for large vocabulary continuous speech recognition")
projects its input to a narrow memory dimension and adds a learned, per-channel weighted sum of
``left`` past and ``right`` future projections (a depthwise Conv1d over time), plus the previous
block's memory (the skip connection). Its look-ahead is bounded, ``right * stride`` frames per
block, so the model streams with a fixed delay: :attr:`ConvDFSMN.lookahead_frames`.

With ``cmvn`` the network's first operation is per-utterance mean and variance normalization of
its input features (:func:`utterance_cmvn`): each mel bin to zero mean and unit variance over the
utterance's frames, which removes what a speaker's voice, a microphone and a level add to every
frame alike (a spectral tilt, a loudness). It is part of the forward pass, not of featurization,
so whatever runs the model (training, evaluation, the fake-quant int8 model, the compiled
packages, ONNX, the server) normalizes the same way from the same log-mel features; the int8
model's first layer then sees inputs of a fixed scale. It needs the whole utterance, as the
server transcribes one; a streaming decoder would need a running estimate instead.
"""

from __future__ import annotations

import math
import unicodedata
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass

import torch
from torch import nn
from torch.nn import functional as F

from domains.speech.audio_features import language_group

BLANK = 0
"""CTC blank id; characters are 1..len(alphabet)."""


@dataclass(frozen=True, kw_only=True)
class ConvDFSMNConfig:
    n_mels: int = 40
    vocab_size: int = 100
    """Output classes including the blank."""
    conv_channels: int = 128
    hidden: int = 256
    """Width of each block's affine (ReLU) layer."""
    memory: int = 128
    """Width of the projections the memory works on."""
    blocks: int = 6
    left: int = 8
    """Past frames each block remembers (its left order)."""
    right: int = 2
    """Future frames each block looks at (its right order): the streaming delay per block."""
    stride: int = 1
    """Spacing of the remembered frames."""
    subsample: int = 2
    """Time subsampling of the front end (1 or 2): features every 10 ms -> outputs every 20 ms."""
    dropout: float = 0.1
    cmvn: bool = False
    """Normalize each utterance's features to zero mean and unit variance per mel bin before
    the front end (:func:`utterance_cmvn`); False for models trained before it existed."""

    def __post_init__(self) -> None:
        if self.subsample not in (1, 2):
            raise ValueError("subsample must be 1 or 2")
        if min(self.blocks, self.left, self.stride, self.memory, self.hidden) < 1:
            raise ValueError("blocks, left, stride, memory and hidden must be >= 1")
        if self.right < 0 or self.vocab_size < 2:
            raise ValueError("right must be >= 0 and vocab_size >= 2")

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


CMVN_EPSILON = 1e-5
"""Added to each bin's variance: a constant bin (digital silence) stays finite."""


def utterance_cmvn(features: torch.Tensor, lengths: torch.Tensor | None = None) -> torch.Tensor:
    """``features [B, T, n_mels]`` with each utterance's mean over its frames removed and each
    bin divided by its standard deviation; with ``lengths`` only the first ``lengths[b]`` frames
    of utterance ``b`` count (the statistics of a padded utterance are its own) and its padding
    frames become 0, the normalized mean."""
    if lengths is None:
        mean = features.mean(dim=1, keepdim=True)
        var = (features - mean).pow(2).mean(dim=1, keepdim=True)
        return (features - mean) * torch.rsqrt(var + CMVN_EPSILON)
    frames = torch.arange(features.shape[1], device=features.device)
    mask = (frames[None, :] < lengths[:, None]).to(features.dtype)[:, :, None]
    count = mask.sum(dim=1, keepdim=True).clamp_min(1.0)
    mean = (features * mask).sum(dim=1, keepdim=True) / count
    var = ((features - mean).pow(2) * mask).sum(dim=1, keepdim=True) / count
    return (features - mean) * torch.rsqrt(var + CMVN_EPSILON) * mask


class DFSMNBlock(nn.Module):
    """affine+ReLU -> linear projection -> bidirectional memory (bounded) + skip."""

    def __init__(self, in_dim: int, config: ConvDFSMNConfig) -> None:
        super().__init__()
        self.affine = nn.Linear(in_dim, config.hidden)
        self.project = nn.Linear(config.hidden, config.memory, bias=False)
        self.left, self.right, self.stride = config.left, config.right, config.stride
        # Depthwise filter over time: taps at -left*stride .. +right*stride, every stride.
        self.memory = nn.Conv1d(
            config.memory,
            config.memory,
            kernel_size=config.left + config.right + 1,
            dilation=config.stride,
            groups=config.memory,
            bias=False,
        )
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x: torch.Tensor, skip: torch.Tensor | None) -> torch.Tensor:
        """``x [B, T, in]`` and the previous block's memory ``skip [B, T, memory]`` -> the
        block's memory ``[B, T, memory]``."""
        p = self.project(self.dropout(F.relu(self.affine(x))))
        padded = F.pad(p.transpose(1, 2), (self.left * self.stride, self.right * self.stride))
        m = p + self.memory(padded).transpose(1, 2)
        return m if skip is None else m + skip


class ConvDFSMN(nn.Module):
    """``features [B, T, n_mels]`` -> CTC log-probabilities ``[B, T', vocab_size]``."""

    def __init__(self, config: ConvDFSMNConfig) -> None:
        super().__init__()
        self.config = config
        c = config.conv_channels
        # Causal-in-time except for one frame of look-ahead per 3-tap conv (padding 1).
        self.front = nn.Sequential(
            nn.Conv1d(config.n_mels, c, kernel_size=3, padding=1),
            nn.BatchNorm1d(c),
            nn.ReLU(),
            nn.Conv1d(c, c, kernel_size=3, stride=config.subsample, padding=1),
            nn.BatchNorm1d(c),
            nn.ReLU(),
        )
        dims = [c] + [config.memory] * (config.blocks - 1)
        self.blocks = nn.ModuleList(DFSMNBlock(d, config) for d in dims)
        self.output = nn.Linear(config.memory, config.vocab_size)

    @property
    def lookahead_frames(self) -> int:
        """Future input frames output frame ``k`` depends on beyond input frame ``k *
        subsample``: the streaming delay in 10 ms feature frames."""
        c = self.config
        front = 2  # two 3-tap convs, one frame of look-ahead each
        return front + c.blocks * c.right * c.stride * c.subsample

    def output_lengths(self, lengths: torch.Tensor) -> torch.Tensor:
        if self.config.subsample == 1:
            return lengths
        return (lengths + 1) // 2

    def forward(self, features: torch.Tensor, lengths: torch.Tensor | None = None) -> torch.Tensor:
        """``lengths`` (frames of each utterance of a padded batch) matter only with ``cmvn``:
        each utterance is normalized over its own frames; None takes every frame (one
        utterance, as inference runs)."""
        if self.config.cmvn:
            features = utterance_cmvn(features, lengths)
        x = self.front(features.transpose(1, 2)).transpose(1, 2)
        skip = None
        for block in self.blocks:
            skip = block(x, skip)
            x = skip
        return F.log_softmax(self.output(x), dim=-1)


def ctc_loss(
    model: ConvDFSMN,
    features: torch.Tensor,
    lengths: torch.Tensor,
    targets: torch.Tensor,
    target_lengths: torch.Tensor,
) -> torch.Tensor:
    """Mean CTC loss of a padded batch (``targets`` concatenated or padded, blank = 0)."""
    log_probs = model(features, lengths)
    return F.ctc_loss(
        log_probs.transpose(0, 1),
        targets,
        model.output_lengths(lengths),
        target_lengths,
        blank=BLANK,
        zero_infinity=True,
    )


def restrict(log_probs: torch.Tensor, allowed: torch.Tensor | None) -> torch.Tensor:
    """``log_probs [..., V]`` with the tokens outside ``allowed`` (bool ``[V]``) at ``-inf`` and
    the rest renormalized: the model's distribution given that only those tokens may be
    spoken. ``None`` leaves them as they are."""
    if allowed is None:
        return log_probs
    if allowed.shape != log_probs.shape[-1:] or not bool(allowed[BLANK]):
        raise ValueError(
            f"allowed tokens must be a [{log_probs.shape[-1]}] mask that keeps the blank"
        )
    masked = log_probs.float().masked_fill(~allowed.to(log_probs.device), float("-inf"))
    return torch.log_softmax(masked, dim=-1)


def log_add(a: float, b: float) -> float:
    """``log(exp(a) + exp(b))`` of two log-probabilities, either possibly ``-inf``."""
    if a == -math.inf:
        return b
    if b == -math.inf:
        return a
    hi = max(a, b)
    return hi + math.log1p(math.exp(-abs(a - b)))


def greedy_decode(
    log_probs: torch.Tensor, length: int | None = None, allowed: torch.Tensor | None = None
) -> list[int]:
    """Best path of one utterance ``[T, V]``: argmax, repeats collapsed, blanks dropped; with
    ``allowed`` (bool ``[V]``, :meth:`Alphabet.allowed`) only those tokens are emitted."""
    log_probs = restrict(log_probs[: length if length is not None else log_probs.shape[0]], allowed)
    best = log_probs.argmax(-1).tolist()
    out, previous = [], BLANK
    for token in best:
        if token != previous and token != BLANK:
            out.append(token)
        previous = token
    return out


def beam_decode(
    log_probs: torch.Tensor,
    beam: int = 8,
    length: int | None = None,
    allowed: torch.Tensor | None = None,
) -> list[int]:
    """CTC prefix beam search over one utterance ``[T, V]`` (no language model); with
    ``allowed`` (bool ``[V]``) no prefix holds a token outside it."""
    steps = restrict(log_probs[: length if length is not None else log_probs.shape[0]], allowed)
    steps = steps.tolist()
    add = log_add

    # prefix -> (log p ending in blank, log p ending in non-blank)
    beams: dict[tuple[int, ...], tuple[float, float]] = {(): (0.0, -math.inf)}
    for frame in steps:
        top = sorted(range(len(frame)), key=frame.__getitem__, reverse=True)[: beam + 1]
        nxt: dict[tuple[int, ...], tuple[float, float]] = {}
        for prefix, (pb, pnb) in beams.items():
            total = add(pb, pnb)
            b, nb = nxt.get(prefix, (-math.inf, -math.inf))
            nxt[prefix] = (add(b, total + frame[BLANK]), nb)
            for token in top:
                if token == BLANK or frame[token] == -math.inf:
                    continue
                extended = (*prefix, token)
                b, nb = nxt.get(extended, (-math.inf, -math.inf))
                if prefix and prefix[-1] == token:
                    # A repeat needs a blank in between to count twice.
                    nxt[extended] = (b, add(nb, pb + frame[token]))
                    b0, nb0 = nxt[prefix]
                    nxt[prefix] = (b0, add(nb0, pnb + frame[token]))
                else:
                    nxt[extended] = (b, add(nb, total + frame[token]))
        beams = dict(sorted(nxt.items(), key=lambda kv: -add(*kv[1]))[:beam])
    return list(max(beams.items(), key=lambda kv: add(*kv[1]))[0])


def script_languages(characters: Iterable[str]) -> dict[str, list[str]]:
    """Languages of an alphabet stored without them: Latin letters and the apostrophe are
    ``english``, CJK ideographs ``mandarin``; any other character belongs to no language."""
    out: dict[str, list[str]] = {}
    for char in sorted(set(characters)):
        if char == " ":
            continue
        if char == "'" or ("a" <= char <= "z"):
            out.setdefault("english", []).append(char)
        elif unicodedata.name(char, "").startswith("CJK"):
            out.setdefault("mandarin", []).append(char)
    return out


VOCABULARY_FORMAT = "cascade.asr.vocabulary/1"
"""The ``format`` of a stored vocabulary (:meth:`Alphabet.to_json`)."""


class Alphabet:
    """Characters <-> ids (blank = 0), and the characters of each language the model speaks
    (the space and the blank belong to every language).

    A trained model's alphabet is fitted from its training transcripts (:meth:`fit`): every
    character they hold after normalization, digits and any script included, and per language
    the characters its utterances used. ``normalization`` names the normalization those
    transcripts went through (``None``: an alphabet not fitted from data, e.g. the fixed one of a
    model stored before alphabets were fitted); ``counts`` how often each character occurred in
    training."""

    def __init__(
        self,
        characters: Sequence[str],
        languages: Mapping[str, Iterable[str]] | None = None,
        *,
        normalization: str | None = None,
        counts: Mapping[str, int] | None = None,
    ) -> None:
        chars = sorted(set(characters))
        self.characters = chars
        self._ids = {c: i + 1 for i, c in enumerate(chars)}
        table = script_languages(chars) if languages is None else languages
        self.languages: dict[str, list[str]] = {
            name: sorted(set(members) & set(chars)) for name, members in table.items()
        }
        self.normalization = normalization
        self.counts = {c: int(n) for c, n in (counts or {}).items() if c in self._ids}

    @classmethod
    def fit(
        cls, transcripts: Iterable[str], languages: Iterable[str | None], *, normalization: str
    ) -> Alphabet:
        """The characters of normalized ``transcripts`` (plus the space, which separates words in
        every language), and per language (:func:`~domains.speech.audio_features.
        language_group` of each utterance's tag; an utterance without one adds to no language)
        the characters its utterances hold."""
        counts: Counter[str] = Counter()
        members: dict[str, set[str]] = {}
        for text, language in zip(transcripts, languages, strict=True):
            counts.update(text)
            if language:
                members.setdefault(language_group(language), set()).update(set(text) - {" "})
        return cls(sorted(set(counts) | {" "}), members, normalization=normalization, counts=counts)

    @property
    def fitted(self) -> bool:
        """Fitted from training transcripts (not a fixed alphabet of an older model)."""
        return self.normalization is not None

    def __len__(self) -> int:
        return len(self.characters) + 1

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Alphabet) and (
            self.characters,
            self.languages,
            self.normalization,
        ) == (other.characters, other.languages, other.normalization)

    def to_json(self) -> dict[str, object]:
        """What :meth:`from_json` reads back: plain JSON, stored beside the model's weights."""
        return {
            "format": VOCABULARY_FORMAT,
            "normalization": self.normalization,
            "characters": list(self.characters),
            "languages": {k: list(v) for k, v in sorted(self.languages.items())},
            "counts": {c: self.counts[c] for c in self.characters if c in self.counts},
        }

    @classmethod
    def from_json(cls, payload: Mapping[str, object], *, where: str = "vocabulary") -> Alphabet:
        if not isinstance(payload, Mapping) or payload.get("format") != VOCABULARY_FORMAT:
            raise ValueError(
                f"{where} is not an ASR vocabulary (format {VOCABULARY_FORMAT!r} expected)"
            )
        characters = payload.get("characters")
        languages = payload.get("languages")
        if not isinstance(characters, list) or not all(
            isinstance(c, str) and len(c) == 1 for c in characters
        ):
            raise ValueError(f"{where}: 'characters' must be a list of single characters")
        if not isinstance(languages, Mapping):
            raise ValueError(f"{where}: 'languages' must map a language to its characters")
        normalization = payload.get("normalization")
        counts = payload.get("counts") or {}
        return cls(
            characters,
            {str(k): list(v) for k, v in languages.items()},
            normalization=None if normalization is None else str(normalization),
            counts=counts if isinstance(counts, Mapping) else {},
        )

    def language_of(self, language: str) -> str:
        """The known language ``language`` names (``en-us`` -> ``english``), or ValueError."""
        group = language_group(language)
        if group not in self.languages:
            known = ", ".join(sorted(self.languages)) or "none"
            raise ValueError(
                f"unknown language {language!r}: this model knows {known} "
                "(a name or a code such as en, en-us, cmn, zh)"
            )
        return group

    def allowed(self, language: str | None) -> torch.Tensor | None:
        """Bool ``[V]`` mask of the tokens ``language`` may emit (blank, space and its
        characters); ``None`` for no language (every token)."""
        if language is None:
            return None
        members = set(self.languages[self.language_of(language)]) | {" "}
        mask = torch.zeros(len(self), dtype=torch.bool)
        mask[BLANK] = True
        for char in members:
            if char in self._ids:
                mask[self._ids[char]] = True
        return mask

    def foreign_tokens(self, text: str, language: str) -> int:
        """Characters of ``text`` outside ``language``'s (spaces excepted); 0 for a language
        the alphabet does not know (nothing to compare with)."""
        try:
            members = set(self.languages[self.language_of(language)]) | {" "}
        except ValueError:
            return 0
        return sum(char not in members for char in text)

    def unseen(self, text: str) -> Counter[str]:
        """Characters of ``text`` the model has no output for (never in its training
        transcripts), with how often each occurs: the model cannot emit them, so each is an
        error in its CER, counted and reported, never a reason to drop the utterance."""
        return Counter(c for c in text if c not in self._ids)

    def encode(self, text: str) -> list[int]:
        """Ids of ``text``; ValueError naming characters the alphabet lacks (training text is
        always covered: the alphabet is fitted from it)."""
        missing = sorted(self.unseen(text))
        if missing:
            raise ValueError(f"characters outside the alphabet: {missing}")
        return [self._ids[c] for c in text]

    def encode_known(self, text: str) -> list[int]:
        """Ids of the characters of ``text`` the alphabet has (the others are :meth:`unseen`)."""
        return [self._ids[c] for c in text if c in self._ids]

    def decode(self, ids: Sequence[int]) -> str:
        return "".join(self.characters[i - 1] for i in ids if i != BLANK)
