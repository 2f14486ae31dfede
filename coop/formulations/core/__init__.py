"""The contract every formulation shares: the registry and solve(), typed options, the deadline, the entry
decorator, SolveResult, progress reports, native solver output, the solving order of first computations."""
