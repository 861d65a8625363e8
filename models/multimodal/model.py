"""A small image-text transformer whose feed-forward blocks are dense or mixture-of-experts.

One stack of transformer blocks reads one sequence per pair: ``[image patches | text (alone) |
text (seeing the image)]``. The attention mask keeps the three parts apart where it matters:

* image patches attend to each other (bidirectional): their mean is the image embedding;
* the first copy of the text attends causally to itself only: its last real token is the text
  embedding, so retrieval never sees the paired image;
* the second copy attends causally to itself and to every patch: it predicts the next token of
  the caption (captioning / image-conditioned language modelling).

Both objectives thus come out of one forward pass, and every MoE layer routes the whole
sequence in one gate call. The objective is ``contrastive + caption_weight * caption +
aux_weight * load_balancing``: a symmetric InfoNCE over the (local) batch, the next-token cross
entropy (padding 0 ignored), and DeepSpeed's auxiliary load-balancing loss of every MoE layer.

Expert prototyping (M6-T, arXiv 2105.15082): the ``num_experts`` experts of a layer are split
into ``prototypes`` groups; each group is one ``deepspeed.moe.layer.MoE`` with top-1 routing and
its own gate, and the layer's output is the sum of the groups' outputs. DeepSpeed's gate offers
top-1, top-2 and a generic top-k over ONE set of experts, but no grouping, so prototyping is built
here from ``prototypes`` top-1 MoE layers. A token thus runs ``prototypes`` experts; with expert
hidden size ``ffn_hidden / prototypes`` the active parameters per token equal those of a dense
feed-forward of ``ffn_hidden`` (plus the gates' ``dim x num_experts`` weights).

The module holds no distributed code: ``ep_size`` only tells DeepSpeed's MoE how many processes
share a layer's experts (the engine creates the expert-parallel groups at ``initialize``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, cast

import torch
from torch import nn
from torch.nn import functional as F

PAD, BOS, EOS = 0, 1, 2


@dataclass(frozen=True, kw_only=True)
class MoEConfig:
    """Mixture-of-experts feed-forward settings (``deepspeed.moe.layer.MoE`` arguments)."""

    num_experts: int = 8
    """Experts per MoE layer, over all prototype groups."""
    prototypes: int = 1
    """Expert prototyping: the experts split into this many groups, each routing top-1."""
    every: int = 1
    """Every ``every``-th block (counting from the last) gets an MoE feed-forward."""
    capacity_factor: float = 1.25
    """Training capacity per expert = ceil(tokens / group_experts * capacity_factor)."""
    eval_capacity_factor: float = 2.0
    """Capacity factor in eval mode."""
    min_capacity: int = 4
    """Capacity floor per expert."""
    noisy_gate_policy: str | None = None
    """``None``, ``"Jitter"`` or ``"RSample"`` (DeepSpeed's gate noise)."""
    drop_tokens: bool = True
    """Drop tokens over capacity (they pass through the residual connection only)."""
    use_residual: bool = False
    """Residual MoE: mix each group's output with a dense expert (adds active parameters)."""
    aux_weight: float = 0.01
    """Weight of the load-balancing loss in the objective."""

    def __post_init__(self) -> None:
        if self.prototypes < 1 or self.num_experts < self.prototypes:
            raise ValueError(
                f"need 1 <= prototypes <= num_experts, got prototypes={self.prototypes}, "
                f"num_experts={self.num_experts}"
            )
        if self.num_experts % self.prototypes:
            raise ValueError(
                f"num_experts={self.num_experts} must split evenly into "
                f"prototypes={self.prototypes} groups"
            )
        if self.every < 1 or self.min_capacity < 0:
            raise ValueError("every must be >= 1 and min_capacity >= 0")
        if not (self.capacity_factor > 0 and self.eval_capacity_factor > 0):
            raise ValueError("capacity factors must be > 0")
        if self.noisy_gate_policy not in (None, "Jitter", "RSample"):
            raise ValueError(
                f"noisy_gate_policy must be None, 'Jitter' or 'RSample', "
                f"got {self.noisy_gate_policy!r}"
            )
        if self.aux_weight < 0:
            raise ValueError("aux_weight must be >= 0")

    @property
    def experts_per_group(self) -> int:
        return self.num_experts // self.prototypes


@dataclass(frozen=True, kw_only=True)
class MultimodalConfig:
    """Shape of :class:`ImageTextTransformer`."""

    image_size: int = 64
    """Images are ``image_size x image_size x 3`` uint8 (HWC)."""
    patch: int = 8
    vocab_size: int = 64
    """Token ids are in ``[0, vocab_size)``; 0 is padding, 1 BOS, 2 EOS."""
    max_tokens: int = 16
    """Text length (tokens beyond are cut, shorter texts padded with 0)."""
    dim: int = 64
    heads: int = 4
    layers: int = 2
    ffn_hidden: int = 256
    """Dense feed-forward hidden size; an MoE expert gets ``ffn_hidden // prototypes``."""
    embed_dim: int = 64
    """Shared image-text embedding size of the contrastive objective."""
    dropout: float = 0.0
    caption_weight: float = 1.0
    """Weight of the captioning loss beside the contrastive one."""
    moe: MoEConfig | None = None
    """``None``: dense feed-forward everywhere."""
    ep_size: int = 1
    """Processes that share each MoE layer's experts (set by the training launcher)."""

    def __post_init__(self) -> None:
        if self.image_size % self.patch:
            raise ValueError(
                f"image_size {self.image_size} is not a multiple of patch {self.patch}"
            )
        if self.dim % self.heads:
            raise ValueError(f"dim {self.dim} is not a multiple of heads {self.heads}")
        if self.vocab_size < 4 or self.max_tokens < 2 or self.layers < 1:
            raise ValueError("need vocab_size >= 4, max_tokens >= 2 and layers >= 1")
        if self.moe is not None:
            if self.ffn_hidden % self.moe.prototypes:
                raise ValueError(
                    f"ffn_hidden={self.ffn_hidden} must split evenly over "
                    f"prototypes={self.moe.prototypes}"
                )
            if self.moe.experts_per_group % self.ep_size:
                raise ValueError(
                    f"ep_size={self.ep_size} must divide the {self.moe.experts_per_group} "
                    "experts of each prototype group"
                )

    @property
    def patches(self) -> int:
        return (self.image_size // self.patch) ** 2

    def is_moe_block(self, index: int) -> bool:
        return self.moe is not None and (self.layers - 1 - index) % self.moe.every == 0


class FeedForward(nn.Module):
    def __init__(self, dim: int, hidden: int, dropout: float) -> None:
        super().__init__()
        self.up = nn.Linear(dim, hidden)
        # No output bias: a prototyped layer sums several experts' outputs, and one bias per
        # expert would make its active parameters differ from the dense block's.
        self.down = nn.Linear(hidden, dim, bias=False)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.down(F.gelu(self.up(x))))


@dataclass
class RoutingStats:
    """One MoE layer's routing of the last forward pass."""

    counts: torch.Tensor
    """Tokens routed to each expert before capacity, ``(prototypes, experts_per_group)``."""
    capacity: int
    """Slots per expert."""

    @property
    def dropped(self) -> int:
        return int((self.counts - self.capacity).clamp(min=0).sum())

    @property
    def routed(self) -> int:
        return int(self.counts.sum())

    @property
    def load_cv(self) -> float:
        """Coefficient of variation of tokens per expert (0 = perfectly even), averaged over
        the prototype groups (each group routes every token once)."""
        counts = self.counts.double()
        cv = counts.std(dim=1, unbiased=False) / counts.mean(dim=1).clamp(min=1e-9)
        return float(cv.mean())


class PrototypedMoE(nn.Module):
    """``prototypes`` DeepSpeed top-1 MoE layers side by side; output = sum of their outputs."""

    def __init__(self, dim: int, hidden: int, moe: MoEConfig, ep_size: int, dropout: float):
        super().__init__()
        from deepspeed.moe.layer import MoE

        self.config = moe
        self.groups = nn.ModuleList(
            MoE(
                hidden_size=dim,
                expert=FeedForward(dim, hidden // moe.prototypes, dropout),
                num_experts=moe.experts_per_group,
                ep_size=ep_size,
                k=1,
                capacity_factor=moe.capacity_factor,
                eval_capacity_factor=moe.eval_capacity_factor,
                min_capacity=moe.min_capacity,
                use_residual=moe.use_residual,
                noisy_gate_policy=moe.noisy_gate_policy,
                drop_tokens=moe.drop_tokens,
            )
            for _ in range(moe.prototypes)
        )
        self.stats: RoutingStats | None = None

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        out = torch.zeros_like(x)
        aux = x.new_zeros(())
        counts = []
        for group in self.groups:
            y, l_aux, exp_counts = group(x)
            out = out + y
            aux = aux + l_aux
            counts.append(exp_counts.detach().cpu())
        tokens = x.shape[0] * x.shape[1]
        factor = self.config.capacity_factor if self.training else self.config.eval_capacity_factor
        # The same capacity as DeepSpeed's gate (sharded_moe._capacity); without drop_tokens
        # nothing is dropped.
        capacity = max(
            math.ceil(tokens / self.config.experts_per_group * factor), self.config.min_capacity
        )
        if not self.config.drop_tokens:
            capacity = tokens
        self.stats = RoutingStats(torch.stack(counts), capacity)
        return out, aux / len(self.groups)


class Block(nn.Module):
    def __init__(self, config: MultimodalConfig, moe: bool) -> None:
        super().__init__()
        self.heads = config.heads
        self.norm1 = nn.LayerNorm(config.dim)
        self.qkv = nn.Linear(config.dim, 3 * config.dim)
        self.proj = nn.Linear(config.dim, config.dim)
        self.norm2 = nn.LayerNorm(config.dim)
        self.dropout = config.dropout
        self.ffn: nn.Module
        if moe:
            assert config.moe is not None
            self.ffn = PrototypedMoE(
                config.dim, config.ffn_hidden, config.moe, config.ep_size, config.dropout
            )
        else:
            self.ffn = FeedForward(config.dim, config.ffn_hidden, config.dropout)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        b, n, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, n, 3, self.heads, d // self.heads).unbind(2)
        attn = F.scaled_dot_product_attention(
            q.transpose(1, 2),
            k.transpose(1, 2),
            v.transpose(1, 2),
            attn_mask=mask,
            dropout_p=self.dropout if self.training else 0.0,
        )
        x = x + self.proj(attn.transpose(1, 2).reshape(b, n, d))
        h = self.norm2(x)
        if isinstance(self.ffn, PrototypedMoE):
            y, aux = self.ffn(h)
            return x + y, aux
        return x + self.ffn(h), x.new_zeros(())


def attention_mask(patches: int, tokens: int) -> torch.Tensor:
    """Boolean ``(n, n)`` mask (True = may attend) of ``[image | text | text-with-image]``."""
    n = patches + 2 * tokens
    mask = torch.zeros(n, n, dtype=torch.bool)
    causal = torch.tril(torch.ones(tokens, tokens, dtype=torch.bool))
    mask[:patches, :patches] = True
    mask[patches : patches + tokens, patches : patches + tokens] = causal
    second = slice(patches + tokens, n)
    mask[second, :patches] = True
    mask[second, second] = causal
    return mask


@dataclass
class Outputs:
    image_embedding: torch.Tensor
    """L2-normalized ``(batch, embed_dim)``."""
    text_embedding: torch.Tensor
    """L2-normalized ``(batch, embed_dim)``."""
    logits: torch.Tensor
    """Next-token logits of the image-conditioned text, ``(batch, max_tokens, vocab)``."""
    aux_loss: torch.Tensor
    """Sum over MoE layers of the load-balancing loss (0 for a dense model)."""
    logit_scale: torch.Tensor


class ImageTextTransformer(nn.Module):
    """See the module docstring. Input: uint8 images ``(B, H, W, 3)`` and token ids ``(B, L)``
    starting with BOS (padding 0 at the end)."""

    def __init__(self, config: MultimodalConfig) -> None:
        super().__init__()
        self.config = config
        p = config.patch
        self.patch_embed = nn.Linear(3 * p * p, config.dim)
        self.image_pos = nn.Parameter(torch.randn(config.patches, config.dim) * 0.02)
        self.token_embed = nn.Embedding(config.vocab_size, config.dim, padding_idx=PAD)
        # Small, like the positions: the tied output layer would start with huge logits.
        nn.init.normal_(self.token_embed.weight, std=0.02)
        self.token_embed.weight.data[PAD] = 0.0
        self.text_pos = nn.Parameter(torch.randn(config.max_tokens, config.dim) * 0.02)
        self.modality = nn.Parameter(torch.randn(3, config.dim) * 0.02)
        self.blocks = nn.ModuleList(
            Block(config, config.is_moe_block(i)) for i in range(config.layers)
        )
        self.norm = nn.LayerNorm(config.dim)
        self.image_proj = nn.Linear(config.dim, config.embed_dim, bias=False)
        self.text_proj = nn.Linear(config.dim, config.embed_dim, bias=False)
        # Shape (1,): DeepSpeed broadcasts parameters as bytes; a 0-d tensor cannot be viewed so.
        self.logit_scale = nn.Parameter(torch.full((1,), math.log(10.0)))
        self.register_buffer(
            "mask", attention_mask(config.patches, config.max_tokens), persistent=False
        )

    def moe_layers(self) -> list[PrototypedMoE]:
        return [m for m in self.modules() if isinstance(m, PrototypedMoE)]

    def patchify(self, images: torch.Tensor) -> torch.Tensor:
        b, h, w, c = images.shape
        p = self.config.patch
        if (h, w, c) != (self.config.image_size, self.config.image_size, 3):
            raise ValueError(
                f"images must be (B, {self.config.image_size}, {self.config.image_size}, 3), "
                f"got {tuple(images.shape)}"
            )
        # In the parameters' dtype: under bf16 training the engine casts them, not the input.
        x = images.float().div(127.5).sub(1.0).to(self.patch_embed.weight.dtype)
        x = x.view(b, h // p, p, w // p, p, c).permute(0, 1, 3, 2, 4, 5)
        return x.reshape(b, (h // p) * (w // p), p * p * c)

    def forward(self, images: torch.Tensor, tokens: torch.Tensor) -> Outputs:
        config = self.config
        n_patch, n_tok = config.patches, config.max_tokens
        if tokens.shape[1] != n_tok:
            raise ValueError(f"tokens must be (B, {n_tok}), got {tuple(tokens.shape)}")
        image = self.patch_embed(self.patchify(images)) + self.image_pos + self.modality[0]
        text = self.token_embed(tokens) + self.text_pos
        x = torch.cat([image, text + self.modality[1], text + self.modality[2]], dim=1)
        aux = x.new_zeros(())
        for block in self.blocks:
            x, layer_aux = block(x, self.mask)
            aux = aux + layer_aux
        x = self.norm(x)
        image_vec = x[:, :n_patch].mean(dim=1)
        # The text embedding is the last real token (EOS) of the text-only copy.
        last = (tokens != PAD).sum(dim=1).clamp(min=1) - 1
        text_vec = x[torch.arange(x.shape[0], device=x.device), n_patch + last]
        logits = x[:, n_patch + n_tok :] @ self.token_embed.weight.T
        return Outputs(
            image_embedding=F.normalize(self.image_proj(image_vec), dim=-1),
            text_embedding=F.normalize(self.text_proj(text_vec), dim=-1),
            logits=logits,
            aux_loss=aux,
            logit_scale=self.logit_scale,
        )


def contrastive_loss(out: Outputs) -> torch.Tensor:
    """Symmetric InfoNCE: pair i's image should pick text i among the batch's, and back."""
    scale = out.logit_scale.clamp(max=math.log(100.0)).exp()
    logits = scale * out.image_embedding @ out.text_embedding.T
    target = torch.arange(logits.shape[0], device=logits.device)
    return 0.5 * (F.cross_entropy(logits, target) + F.cross_entropy(logits.T, target))


def caption_loss(out: Outputs, tokens: torch.Tensor) -> torch.Tensor:
    """Next-token cross entropy of the image-conditioned text (padding ignored)."""
    return F.cross_entropy(
        out.logits[:, :-1].reshape(-1, out.logits.shape[-1]),
        tokens[:, 1:].reshape(-1),
        ignore_index=PAD,
    )


def objective(
    model: ImageTextTransformer, out: Outputs, tokens: torch.Tensor
) -> tuple[torch.Tensor, dict[str, float]]:
    """The training loss and its parts."""
    contrastive = contrastive_loss(out)
    caption = caption_loss(out, tokens)
    config = model.config
    aux_weight = config.moe.aux_weight if config.moe is not None else 0.0
    loss = contrastive + config.caption_weight * caption + aux_weight * out.aux_loss
    return loss, {
        "contrastive": float(contrastive.detach()),
        "caption": float(caption.detach()),
        "aux": float(out.aux_loss.detach()),
    }


def parameter_counts(model: ImageTextTransformer) -> dict[str, int]:
    """``total``, ``active`` (what one token runs through) and ``router`` (the gates' weights,
    included in ``active``). An MoE layer's experts count as ``prototypes`` experts active."""
    total = sum(p.numel() for p in model.parameters())
    expert_total = 0
    expert_active = 0
    router = 0
    for layer in model.moe_layers():
        for group in cast(list[Any], list(layer.groups)):  # deepspeed.moe.layer.MoE
            experts = group.deepspeed_moe.experts.deepspeed_experts
            per_expert = sum(p.numel() for p in experts[0].parameters())
            # Under expert parallelism a process holds only its local experts.
            expert_total += per_expert * group.num_experts
            expert_active += per_expert
            router += sum(p.numel() for p in group.deepspeed_moe.gate.parameters())
    local = sum(
        p.numel() for layer in model.moe_layers() for p in layer.parameters() if _is_expert(p)
    )
    shared = total - local
    return {
        "total": shared + expert_total,
        "active": shared + expert_active,
        "router": router,
    }


def _is_expert(param: torch.Tensor) -> bool:
    return not getattr(param, "allreduce", True)
