"""Checkmate's frontier-advancing stages (Jain et al. 2020), the substrate of checkmate, monet and poet's MILPs."""
