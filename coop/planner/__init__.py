"""Planner: orchestration only. ``plan()`` = capture -> formulation -> validate -> executor."""

from coop.planner.plan import Plan, load_plan, plan

__all__ = ["Plan", "load_plan", "plan"]
