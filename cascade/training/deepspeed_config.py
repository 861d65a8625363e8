"""The one DeepSpeed config builder: every trainer states its batch size, optimizer settings,
ZeRO stage, precision and schedule, and gets the JSON config DeepSpeed reads."""

from __future__ import annotations

from typing import Any


def warmup_decay_scheduler(*, lr: float, steps: int, warmup_steps: int) -> dict[str, Any]:
    """Linear warm-up from 0 to ``lr``, then linear decay to 0 over ``steps`` (DeepSpeed keeps
    the scheduler in the checkpoint, so a resumed run keeps its rate)."""
    return {
        "type": "WarmupDecayLR",
        "params": {
            "total_num_steps": steps,
            "warmup_min_lr": 0.0,
            "warmup_max_lr": lr,
            "warmup_num_steps": max(1, min(warmup_steps, steps - 1)),
            "warmup_type": "linear",
        },
    }


def deepspeed_config(
    *,
    micro_batch_size: int,
    lr: float,
    zero_stage: int,
    weight_decay: float | None = None,
    plain_adam: bool = False,
    bf16: bool | None = None,
    gradient_clipping: float | None = None,
    scheduler: dict[str, Any] | None = None,
    throughput_timer: bool = True,
) -> dict[str, Any]:
    """A DeepSpeed config with torch's Adam (DeepSpeed's fused CPU Adam compiles for ~80 s on
    first use; torch's is enough here).

    ``weight_decay``: the optimizer's, when given. ``plain_adam``: DeepSpeed's "Adam" is torch's
    AdamW (weight decay 0.01) unless ``adam_w_mode`` is off; on, it is plain Adam, the optimizer
    of a plain PyTorch loop. ``bf16``: whether bf16 runs (the caller gates it on the
    accelerator's support); None leaves the section out. ``gradient_clipping``, ``scheduler``
    (e.g. :func:`warmup_decay_scheduler`): added when given. ``throughput_timer=False`` turns
    off the engine's samples/s timer, which runs (and synchronizes the device) on every step
    even when nothing prints it.
    """
    params: dict[str, Any] = {"lr": lr}
    if weight_decay is not None:
        params["weight_decay"] = weight_decay
    params["torch_adam"] = True
    if plain_adam:
        params["adam_w_mode"] = False
    config: dict[str, Any] = {
        "train_micro_batch_size_per_gpu": micro_batch_size,
        "gradient_accumulation_steps": 1,
        "optimizer": {"type": "Adam", "params": params},
    }
    if scheduler is not None:
        config["scheduler"] = scheduler
    config["zero_optimization"] = {"stage": zero_stage}
    if bf16 is not None:
        config["bf16"] = {"enabled": bool(bf16)}
    if gradient_clipping is not None:
        config["gradient_clipping"] = gradient_clipping
    config["steps_per_print"] = 10**9
    config["wall_clock_breakdown"] = False
    if not throughput_timer:
        config["timers"] = {"throughput": {"enabled": False, "synchronized": False}}
    return config
