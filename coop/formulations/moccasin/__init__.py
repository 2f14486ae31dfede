"""Moccasin (Bartan et al., ICML 2023): retention intervals on CP-SAT."""
