"""Schedules without an exact solver: baselines, fast heuristics, warm starts, polish passes, PyTorch's min-cut."""
