"""Moccasin's slot axis and retention intervals on CP-SAT (Bartan et al. 2023), the substrate of moccasin, monet
and poet's interval models, and the slot problem the heuristics edit."""
