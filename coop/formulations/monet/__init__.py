"""MONeT (Shah et al. 2021): rematerialization with operator implementations, as a stage MILP and on intervals."""
