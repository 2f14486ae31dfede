"""POET (Patil et al., ICML 2022): rematerialization with paging, as a stage MILP and on intervals."""
