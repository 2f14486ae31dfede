"""Torch-free engines over a Graph: the address-ordered arena, online eviction policies, the online simulator.

* :mod:`coop.online.arena`: an address-ordered arena (best fit, free neighbours merged);
* :mod:`coop.online.policies`: eviction policies DTR, DTE and Coop's sliding window;
* :mod:`coop.online.online_sim`: online eviction over a Graph under a budget (sweeps, warm starts);
* :mod:`coop.online.delta`, :mod:`coop.online.delta_decisions`, :mod:`coop.online.delta_sim`: DELTA, swap to host or
  recompute, with prefetching (its decisions one object that both DELTA engines hold).

Static plans' addresses (best fit, exact, packed) are :mod:`coop.runtime.placement`'s.

Nothing here imports torch, so formulations, ``coop compare`` and the planner may all use them;
:mod:`coop.runtime` keeps what touches tensors.
"""
