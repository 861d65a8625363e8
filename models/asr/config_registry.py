"""Named, complete training configs for the ASR model (ConvDFSMN + CTC, then RSQ int8 QAT).

Each config is a function returning a frozen :class:`AsrTrainConfig`; variants copy a base with
:func:`dataclasses.replace`. ``debug`` trains on CPU in seconds on a few dozen utterances (tests,
the DAG's CI run); ``synthetic`` is sized for the espeak-ng corpus of
``corpus_utterances`` utterances (``cascade asr synthesize --count N``) and the issue's
goal, CER <= 5% on the test split's unseen voices, within about 45 minutes of one CPU core per
process (2 processes); ``fast`` is in between: the same corpus's synthetic voices, a smaller
network and fewer steps, <= 15 minutes on 2 cores, CER <= 10%. Pick one by name with
:func:`get_config`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from models.asr.corpus import Augmentation
from models.asr.model import Alphabet, ConvDFSMNConfig


def _model(**changes: Any) -> ConvDFSMNConfig:
    # vocab_size is the default's until training fits the alphabet (sized_for).
    return ConvDFSMNConfig(**changes)


@dataclass(frozen=True, kw_only=True)
class AsrTrainConfig:
    """Everything one ASR training run needs besides its corpus and output folder."""

    name: str
    """Config name, as given to :func:`get_config`; logged with the run."""
    model: ConvDFSMNConfig = field(default_factory=_model)
    """Shape of the network. Its ``vocab_size`` is set by training (:meth:`sized_for`): the
    output characters are fitted from the training corpus, so a named config does not fix it."""
    corpus_utterances: int = 8_000
    """Utterances to land for this config (``jobs.audio_corpus land --count``): what its figures
    were measured on. Training uses whatever corpus it is given."""
    max_train_utterances: int | None = None
    """Use only the first this many training utterances (by id); ``None``: all of them."""
    train_people: bool = True
    """Train on the recordings of people in the training split as well as the synthesizers'
    voices; False keeps only synthetic voices (a config judged on synthetic speech spends its
    steps there)."""
    people_share: float = 0.0
    """Least share of each epoch's training utterances that are people's recordings: when the
    corpus holds fewer, each recording is used a whole number of times per epoch (the fewest
    that reach the share, :func:`models.asr.train.people_repeats`); 0 keeps the corpus's own
    balance. The synthesizers' voices outnumber the recorded people many times over."""
    batch_size: int = 16
    """Utterances per micro-batch and process; the global batch is ``batch_size * world``."""
    bucket_batches: int = 32
    """Length bucketing: each epoch the shuffled utterances are cut into pools of this many
    batches, each pool sorted by length and cut into batches (little padding, random order)."""
    lr: float = 2e-3
    """Peak Adam learning rate of the fp32 phase (linear warm-up, then linear decay to 0)."""
    weight_decay: float = 1e-5
    warmup_steps: int = 200
    """Linear warm-up of each phase's learning rate."""
    fp32_steps: int = 4_000
    """Optimizer steps of the fp32 phase."""
    qat_steps: int = 800
    """Optimizer steps of the RSQ quantization-aware phase (started from the fp32 weights)."""
    qat_lr: float = 3e-4
    """Peak learning rate of the QAT phase."""
    qat_freeze_ranges: float = 0.5
    """Share of the QAT steps after which the activation ranges stop following their EMA and
    stay fixed, so the weights adapt to the ranges the int8 model will use."""
    range_momentum: float = 0.95
    """EMA momentum of the activation ranges (of each step's largest magnitude)."""
    distill_weight: float = 0.5
    """Weight of the KL(fp32 teacher || QAT student) term of the QAT loss; the CTC loss gets
    ``1 - distill_weight``."""
    distill_temperature: float = 1.0
    """Temperature of both posteriors in the distillation term."""
    bits: int = 8
    """Quantization width of weights and activations (symmetric: ``2**(bits-1) - 1`` levels)."""
    spec_augment: bool = True
    """Frequency and time masks plus a random loudness shift on training batches: the test
    voices are unseen, so the model must not lean on one voice's spectrum."""
    augmentation: Augmentation = field(default_factory=Augmentation)
    """On-the-fly speed, room-impulse and noise perturbation of training utterances (off by
    default; :class:`~models.asr.corpus.Augmentation`)."""
    gradient_clipping: float = 5.0
    """Clip the global gradient norm (CTC gradients spike on hard utterances)."""
    zero_stage: int = 1
    """DeepSpeed ZeRO stage (0-3)."""
    seed: int = 0
    """Initialization, batch order, dropout and augmentation are functions of the seed and the
    step, so a resumed run ends with the same weights."""
    log_every: int = 25
    """Print and log the loss every this many steps."""
    checkpoint_every: int = 250
    """Save a resumable DeepSpeed checkpoint every this many optimizer steps of a phase."""
    eval_beam: int = 0
    """Prefix beam width of the final evaluation (0: greedy only)."""
    int8_max_cer_delta: float = 0.002
    """The compile gate's accuracy check: the compiled int8 package's CER may exceed the fp32
    model's on the same held-out utterances by at most this (0.002 = 0.2 points)."""

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("AsrTrainConfig.name must be a non-empty config name")
        if not isinstance(self.model, ConvDFSMNConfig):
            raise TypeError(f"model must be a ConvDFSMNConfig, got {type(self.model).__name__}")
        if not isinstance(self.augmentation, Augmentation):
            raise TypeError(
                f"augmentation must be an Augmentation, got {type(self.augmentation).__name__}"
            )
        positive = {
            "corpus_utterances": self.corpus_utterances,
            "batch_size": self.batch_size,
            "bucket_batches": self.bucket_batches,
            "fp32_steps": self.fp32_steps,
            "log_every": self.log_every,
            "checkpoint_every": self.checkpoint_every,
        }
        bad = [f"{k}={v}" for k, v in positive.items() if v < 1]
        if bad:
            raise ValueError(f"these must be >= 1: {', '.join(bad)}")
        if self.max_train_utterances is not None and self.max_train_utterances < 1:
            raise ValueError("max_train_utterances must be >= 1 or None")
        if self.qat_steps < 1:
            raise ValueError("qat_steps must be >= 1: the int8 model needs its activation ranges")
        if self.warmup_steps < 0 or self.eval_beam < 0 or self.seed < 0:
            raise ValueError("warmup_steps, eval_beam and seed must be >= 0")
        if not (self.lr > 0 and self.qat_lr > 0) or self.weight_decay < 0:
            raise ValueError("lr and qat_lr must be > 0 and weight_decay >= 0")
        if not 0.0 <= self.people_share < 1.0:
            raise ValueError(
                f"people_share must be in [0, 1) (0 keeps the corpus's balance), got "
                f"{self.people_share}"
            )
        if not 0.0 <= self.distill_weight <= 1.0:
            raise ValueError(f"distill_weight must be in [0, 1], got {self.distill_weight}")
        if not self.distill_temperature > 0:
            raise ValueError("distill_temperature must be > 0")
        if not 0.0 <= self.qat_freeze_ranges <= 1.0 or not 0.0 <= self.range_momentum < 1.0:
            raise ValueError("qat_freeze_ranges must be in [0, 1] and range_momentum in [0, 1)")
        if not 2 <= self.bits <= 8:
            raise ValueError(f"bits must be in [2, 8] (int8 storage), got {self.bits}")
        if self.zero_stage not in (0, 1, 2, 3):
            raise ValueError(f"zero_stage must be 0, 1, 2 or 3, got {self.zero_stage}")
        if not 0.0 <= self.int8_max_cer_delta <= 1.0:
            raise ValueError(f"int8_max_cer_delta must be in [0, 1], got {self.int8_max_cer_delta}")
        if self.gradient_clipping < 0:
            raise ValueError("gradient_clipping must be >= 0 (0 = off)")

    def sized_for(self, alphabet: Alphabet) -> AsrTrainConfig:
        """This config with the output layer of ``alphabet`` (its characters plus the blank)."""
        model = dataclasses.replace(self.model, vocab_size=len(alphabet))
        return dataclasses.replace(self, model=model)

    @property
    def levels(self) -> int:
        return 2 ** (self.bits - 1) - 1

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> AsrTrainConfig:
        data = dict(data)
        augmentation = Augmentation.from_dict(data.pop("augmentation", {}))
        return cls(model=ConvDFSMNConfig(**data.pop("model")), augmentation=augmentation, **data)

    def flat_params(self) -> dict[str, str]:
        """``model.hidden``-style flat keys, for MLflow params."""
        flat: dict[str, str] = {}
        for key, value in self.to_dict().items():
            if isinstance(value, dict):
                flat.update({f"{key}.{k}": str(v) for k, v in value.items()})
            else:
                flat[key] = str(value)
        return flat


def asr_debug() -> AsrTrainConfig:
    """A tiny network, a few dozen utterances, ~30 steps: seconds on CPU."""
    return AsrTrainConfig(
        name="debug",
        model=_model(conv_channels=16, hidden=32, memory=16, blocks=2, left=4, right=1),
        corpus_utterances=48,
        max_train_utterances=32,
        batch_size=4,
        bucket_batches=4,
        lr=5e-3,
        warmup_steps=2,
        fp32_steps=16,
        qat_steps=8,
        qat_lr=1e-3,
        spec_augment=True,
        zero_stage=1,
        log_every=4,
        checkpoint_every=6,
        # Seconds of training: its CER is noise, so the gate checks the compiler, not accuracy.
        int8_max_cer_delta=1.0,
    )


AUGMENTATION = Augmentation(speed=0.5, reverb=0.3, noise=0.4)
"""The augmentation of the configs that train on people as well as synthesizers: half of the
utterances sped up or slowed down by up to 10%, a third reverberated, 40% mixed with noise."""


def asr_synthetic() -> AsrTrainConfig:
    """The synthetic corpus (8k utterances, 6.3k of them in training voices) plus whatever people
    the corpus trains on: 5k fp32 steps of 2 x 16 utterances (~25 epochs), then 600 QAT steps
    with distillation; 0.48M parameters; speed, room and noise augmentation."""
    return dataclasses.replace(
        asr_debug(),
        name="synthetic",
        model=_model(
            conv_channels=128, hidden=256, memory=128, blocks=6, left=8, right=2, dropout=0.1
        ),
        corpus_utterances=8_000,
        max_train_utterances=None,
        batch_size=16,
        bucket_batches=32,
        lr=2e-3,
        warmup_steps=200,
        fp32_steps=5_000,
        qat_steps=600,
        qat_lr=3e-4,
        zero_stage=1,
        log_every=25,
        checkpoint_every=250,
        eval_beam=8,
        int8_max_cer_delta=0.002,
        augmentation=AUGMENTATION,
    )


PEOPLE_AUGMENTATION = Augmentation(speed=0.5)
"""Speed perturbation on half of the utterances (with SpecAugment's masks): on the dev split,
adding coloured noise to 40% of them left people's CER where it was and cost the synthetic
voices (``people``'s docstring)."""


def asr_people() -> AsrTrainConfig:
    """The recipe for people: ``synthetic``'s network with per-utterance CMVN in the network
    (speaker and channel normalization), speed perturbation and SpecAugment, people's
    recordings repeated to at least 70% of each epoch (``people_share``), 18k fp32 steps,
    600 QAT steps. The full ``cascade bench asr`` trains it.

    Chosen on a dev split carved from the seen speakers' training sentences (15% of their
    distinct sentences, seed ``recipe-dev``; the benchmark's test sentences untouched), with
    4,000-step fp32 runs of this network (``docs/pipelines/asr.md``, the recipe for recorded
    people): held-out Czech sentences improved with every increase of people's share (the
    corpus's own fifth, a half, three quarters) while the unseen synthetic voices lost what
    their share lost. People's share is therefore raised and the steps more than tripled, so
    that the synthetic voices get at least as many draws as they had at the corpus's own
    balance and people more than ten times as many. (A share of 60% over 12k steps left
    held-out Czech sentences at 31.5% with the n-grams.)"""
    return dataclasses.replace(
        asr_synthetic(),
        name="people",
        model=_model(
            conv_channels=128,
            hidden=256,
            memory=128,
            blocks=6,
            left=8,
            right=2,
            dropout=0.1,
            cmvn=True,
        ),
        people_share=0.7,
        augmentation=PEOPLE_AUGMENTATION,
        fp32_steps=18_000,
        qat_steps=600,
    )


def asr_fast() -> AsrTrainConfig:
    """Between ``debug`` and ``synthetic``: a 0.25M-parameter network (5 blocks of 192/96),
    3,300 fp32 steps of 2 x 16 utterances at a higher peak rate, 300 QAT steps, greedy
    evaluation. It trains on the synthesizers' voices only (``train_people=False``) with speed
    perturbation alone: the room impulse and the noise, and the people's recordings (64% of the
    training split), slow its convergence on the synthetic speech it is judged on.

    Measured on a quiet 2-core Xeon (8,000 synthetic utterances landed + all Tux Paint readers,
    6,494 synthetic training utterances, 2 processes): 717 s from start to result (12.1 min
    wall with start-up), synthetic test CER 6.48% fp32 / 6.56% int8 (WER 26.9% / 27.2%), dev
    9.9%, no foreign tokens; held-out people 88% (it never hears people). The earlier recipe
    (people and all three augmentations, 2,000 + 250 steps) ended at 41%; the same network with
    people dropped but all augmentations, 3,500 + 300 steps, at 11.7% in 915 s."""
    return dataclasses.replace(
        asr_synthetic(),
        name="fast",
        model=_model(
            conv_channels=96, hidden=192, memory=96, blocks=5, left=8, right=2, dropout=0.1
        ),
        train_people=False,
        lr=3e-3,
        warmup_steps=150,
        fp32_steps=3_300,
        qat_steps=300,
        augmentation=Augmentation(speed=0.5),
        qat_lr=3e-4,
        checkpoint_every=250,
        eval_beam=0,
    )


CONFIGS: dict[str, Callable[[], AsrTrainConfig]] = {
    "debug": asr_debug,
    "fast": asr_fast,
    "synthetic": asr_synthetic,
    "people": asr_people,
}
"""Config names accepted by :func:`get_config` and ``models.asr.train --config``."""


def get_config(name: str) -> AsrTrainConfig:
    try:
        return CONFIGS[name]()
    except KeyError:
        raise ValueError(f"unknown ASR config {name!r}; choose one of {sorted(CONFIGS)}") from None
