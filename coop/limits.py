"""Numeric limits shared by every layer, in a module that imports nothing, so that the budget
parser (coop.budget) and the schedule reader (coop.schedule) both use them without importing each other."""

from __future__ import annotations

#: The largest budget coop accepts (1 EiB): larger numbers are typos, and would overflow the
#: 64-bit integers of the solvers' models.
MAX_BUDGET = 2**60
