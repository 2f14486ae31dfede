"""The zoo sizes at which a step's activations outweigh what no schedule can shrink at 0.6 of the baseline peak
(parameters and gradients, oneDNN's convolution scratch): shared by tests/test_arena_budget.py and
benchmarks/bench_held.py."""

from __future__ import annotations

FRACTION = 0.6
#: Per zoo model: its size, and the solver's time limit per round (seconds).
SIZES: dict[str, tuple[dict[str, int], float]] = {
    "mlp": ({"batch": 256}, 1),
    "cnn": ({"batch": 8, "hidden": 16, "layers": 6}, 1),
    "transformer": ({"batch": 8}, 1),
    "gpt2": ({"batch": 4}, 1),
    "bert": ({"batch": 8}, 1),
    "resnet": ({"batch": 8, "image": 64, "layers": 6, "hidden": 16}, 3),
    "llama": ({"batch": 8}, 1),
    "vit": ({"batch": 16}, 1),
    "mobilenet": ({"batch": 8, "image": 64}, 3),
}
