"""Checkmate (Jain et al., MLSys 2020): the stage MILP and its LP rounding."""
