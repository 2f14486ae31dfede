"""The slack rounds of the measured re-solve (coop.compiled.refit): a fitting but costly first plan is replaced.

Oracles: hand-computed raises, and a brute force over a step whose held bytes are a known step function of the
raise (the slack phase's best fitting raise against the largest that fits).
"""

from __future__ import annotations

import itertools

import pytest

from coop.compiled.refit import SHAVE_STEP, SlackPoint, next_slack_round, next_slack_shave

REQUESTED = 12_010_820  # LLaMA at 0.5 in bench_compile


def test_a_slack_round_that_missed_is_planned_again_with_the_slack_less_the_miss() -> None:
    """First plan held 500,000 B below the budget: the next is raised by 500,000; it missed by 214,000: the next is
    raised by 500,000 - 214,000 - 65,536 (one shave step more, hand count) = 220,464; that one fit with 20,000 B
    left (below 2 % of the budget): done."""
    points = [SlackPoint(0, -500_000)]
    assert next_slack_shave(points, REQUESTED, True) == -500_000
    points.append(SlackPoint(500_000, 214_000))
    assert next_slack_shave(points, REQUESTED, True) == -220_464
    points.append(SlackPoint(220_464, -20_000))
    assert next_slack_shave(points, REQUESTED, True) is None


def test_no_slack_round_for_a_plan_that_recomputes_nothing_or_leaves_little() -> None:
    assert next_slack_shave([SlackPoint(0, -3_000_000)], REQUESTED, False) is None
    assert next_slack_shave([SlackPoint(0, -(REQUESTED // 50))], REQUESTED, True) is None


def test_a_miss_larger_than_the_raise_halves_the_bracket_and_a_narrow_bracket_stops() -> None:
    """Raised by 400,000 and missed by 600,000: the secant (-200,000) leaves the bracket (0, 400,000), so the
    middle, 200,000; a bracket narrower than two shave steps ends the phase."""
    points = [SlackPoint(0, -400_000), SlackPoint(400_000, 600_000)]
    assert next_slack_shave(points, REQUESTED, True) == -200_000
    narrow = [SlackPoint(0, -400_000), SlackPoint(SHAVE_STEP + 10, 5)]
    assert next_slack_shave(narrow, REQUESTED, True) is None


@pytest.mark.parametrize(("slack0", "slope"), [(1_000_000, 1.0), (1_000_000, 1.5), (1_000_000, 3.0),
                                              (2_500_000, 1.2), (600_000, 0.7)])
def test_the_slack_phase_ends_near_the_largest_fitting_raise_against_brute_force(slack0: int, slope: float) -> None:
    """A step that holds ``slope`` bytes more per byte of raise, and ``slack0`` below the budget unraised: within
    six rounds the best fitting raise tried is at most the brute force's largest fitting raise (a 1 kB grid) and
    within three shave steps of it (or of the raise that 2 % of the budget in slack stands for), no raise is tried
    twice, and the phase ends."""

    def excess(raised: int) -> int:
        return round(slope * raised) - slack0

    points = [SlackPoint(0, excess(0))]
    while len(points) < 6:
        shave = next_slack_shave(points, REQUESTED, True)
        if shave is None:
            break
        points.append(SlackPoint(-shave, excess(-shave)))
    fitted = max(p.raised for p in points if p.excess <= 0)
    brute = max(r for r in range(0, 10_000_001, 1000) if excess(r) <= 0)
    left = REQUESTED // 50 / slope + 1000  # a fit leaving at most 2 % of the budget is not raised again
    assert brute - max(3 * SHAVE_STEP, left) <= fitted <= brute, points
    assert all(a.raised != b.raised for a, b in itertools.combinations(points, 2)), points


def test_a_raise_that_changes_nothing_held_ends_the_slack_phase() -> None:
    """ResNet at 0.9 (bench_compile, 2026-11-29): the raised budget gave the same plan and the same held bytes
    (80,979 B of slack both times); a third round would compile it once more."""
    points = [SlackPoint(0, -80_979), SlackPoint(80_979, -80_979)]
    assert next_slack_shave(points, 2_888_107, True) is None
    assert next_slack_shave(points[:1], 2_888_107, True) == -80_979


def test_a_tight_fit_that_recomputes_is_planned_once_more_on_its_buffers_at_its_own_budget() -> None:
    """Pinned LLaMA at 0.5: round 0 fitted with 31 kB of slack (too little to raise) recomputing 1.527 GFLOP. With
    new buffers observed it is planned again at its own raise (0); without, or when it recomputes nothing, or after
    a miss with nothing to raise into, the phase ends. A miss inside the bracket says its size in the reason."""
    fit = [SlackPoint(0, -31_000)]
    assert next_slack_round(fit, REQUESTED, True, True) == (
        0, "planned again at the fitting round's budget on the buffers inductor kept")
    assert next_slack_round(fit, REQUESTED, True, False) is None
    assert next_slack_round(fit, REQUESTED, False, True) is None
    missed_at_zero = [SlackPoint(0, -31_000), SlackPoint(0, 5_000)]
    assert next_slack_round(missed_at_zero, REQUESTED, True, True) is None
    near_miss = [SlackPoint(0, -609_000), SlackPoint(609_000, 44_812)]
    reason = "planned again with the slack less the last round's miss (44,812 B) and a shave step"
    assert next_slack_round(near_miss, REQUESTED, True, False) == (-(609_000 - 44_812 - SHAVE_STEP), reason)


def test_a_replan_on_the_buffers_that_held_the_same_ends_the_slack_phase() -> None:
    """ViT at 0.9 (bench_compile, 2026-12-01): round 0 fitted with 807,650 B of slack (under 2 % of the budget), was
    planned again on its buffers at its own budget, and held the same 51,228,456 B; a third round planned on the
    next observation held them again. Two identical points end the phase even with a new observation."""
    fit = SlackPoint(0, 51_228_456 - 52_036_106)
    assert next_slack_round([fit], 52_036_106, True, True) == (
        0, "planned again at the fitting round's budget on the buffers inductor kept")
    assert next_slack_round([fit, fit], 52_036_106, True, True) is None
    assert next_slack_round([fit, SlackPoint(0, fit.excess + 4096)], 52_036_106, True, True) is not None
