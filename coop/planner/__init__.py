"""Planner: orchestration only. ``plan()`` = capture -> formulation -> validate -> executor.

Every plan shows the face of :class:`BasePlan`: a static :class:`Plan` (a validated schedule the
executor replays) or a :class:`DynamicPlan` (online eviction on real tensors).
"""

from coop.planner.base import BasePlan
from coop.planner.dynamic import DynamicPlan
from coop.planner.plan import Plan, load_plan, plan

__all__ = ["BasePlan", "DynamicPlan", "Plan", "load_plan", "plan"]
