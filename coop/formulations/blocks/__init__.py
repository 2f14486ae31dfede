"""Structure-aware formulations: repeated blocks (Rockmate / HiRemate-style) and per-layer checkpointing."""
