"""Image-text transformer with mixture-of-experts feed-forward blocks (DeepSpeed MoE)."""
