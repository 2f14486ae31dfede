"""Shared fixtures: where the published benchmark graphs live."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from hypothesis import settings

# The suite draws the same examples on every run (CI stays reproducible: a failure is a bug, not a
# draw); `HYPOTHESIS_PROFILE=explore` draws new ones, and benchmarks/bench_fuzz explores at scale.
settings.register_profile("reproducible", derandomize=True, database=None)
settings.register_profile("explore")
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "reproducible"))

# Plain `pytest` (not `python -m pytest`) does not put the checkout on sys.path; the tests import
# `coop` and `tests.strategies` from it without an install.
_CHECKOUT = str(Path(__file__).resolve().parents[1])
if _CHECKOUT not in sys.path:
    sys.path.insert(0, _CHECKOUT)

# One intra-op thread per pytest-xdist worker when the workers fill the cores (`make test`: 2 workers on 2 cores).
# With torch's default (one OpenMP thread per core) each worker's threads spin-wait for cores the other worker holds:
# BERT-tiny's replayed step took 11-16 s at 2 threads and 1.6-1.7 s at 1 under a load of 9 on 2 cores (2026-11-29).
# Tests whose subject is the thread count set it themselves (test_arena_budget, test_delta_fallback,
# test_alternatives_norm_forward, test_compile); the child processes the suite starts inherit the setting, and a
# user's own OMP_NUM_THREADS is kept.
_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0"))
# And OpenMP's threads sleep rather than spin while they wait (a user's own OMP_WAIT_POLICY is kept): the tests that set
# 2 threads share the cores with the other worker, and a spinning thread burns the core its partner waits for. Results
# are the same bits (the policy only decides how an idle thread waits): test_arena_budget's cnn and mlp arena cases
# took 48-50 s with spinning threads and 22-31 s with sleeping ones under a load of 5-6 on 2 cores (2026-11-29). Set before torch loads
# OpenMP (no plugin of the suite imports torch), and inherited by the processes the suite starts.
if _WORKERS:
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
# And inductor compiles its kernels in the test's own process (a user's own TORCHINDUCTOR_COMPILE_THREADS is kept): its
# default on 2 cores (compile_threads 2) starts a pool of compile-worker subprocesses, each importing torch, that then
# compete with the other worker for the cores. Kernels are the same (only where they are compiled changes): the first
# compiling test with the compiling fixture took 49-57 s wall and 30-31 s user CPU against 53-62 s and 32-34 s with the
# pool, a fresh inductor cache each run, two runs each, 2026-11-30.
if _WORKERS:
    os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")
if _WORKERS and "OMP_NUM_THREADS" not in os.environ:
    _THREADS = max(1, (os.cpu_count() or 1) // _WORKERS)
    os.environ["OMP_NUM_THREADS"] = os.environ["MKL_NUM_THREADS"] = str(_THREADS)
    if "torch" in sys.modules:  # imported before this file (a plugin): OpenMP has read its setting already
        sys.modules["torch"].set_num_threads(_THREADS)

#: The published Moccasin/Checkmate graphs shipped with the project (graphs/moccasin/README.md names their source).
MOCCASIN_DIR = Path(__file__).resolve().parents[1] / "graphs" / "moccasin"


@pytest.fixture(scope="session")
def moccasin_dir() -> Path:
    """The folder of published graphs (graphs/moccasin); skips the test when it is absent."""
    if not MOCCASIN_DIR.is_dir():
        pytest.skip(f"published graphs not found at {MOCCASIN_DIR} (graphs/moccasin of the checkout)")
    return MOCCASIN_DIR


#: Parametrized siblings moved to the slow tier (`make test-all`) to keep `make test` short (issue 44). Each entry
#: names a case whose test keeps a smaller case of the same path and oracle in the fast tier (the comment names it);
#: chosen from the suite's measured durations (`pytest --durations=0`), heaviest first.
SLOW_SIBLINGS: dict[str, str] = {
    "test_integrations_transformers.py::test_coop_trainer_subclass_matches_the_plain_trainer[checkpoint-all]":
        "the one-line Trainer test stays",
    "test_integrations_lightning.py::test_bf16_mixed_precision_is_captured_and_bit_identical[checkpoint-all]":
        "the Lightning callback test and the autocast captures of test_training_context stay",
    "test_graph_replay.py::test_replayed_draws_are_refused_where_the_probe_finds_graphs_do_not_replay_saved_states"
    "[refused-found0]": "the graph-local refusal stays",
    "test_fsdp.py::test_fsdp_meta_plan_and_autocast_plan_train_bit_identically_and_refusals_are_one_line":
        "the FSDP plans' bit-identical test stays",
    "test_plan.py::test_transformers_models_replay_equal_to_eager_under_every_baseline[gpt2]":
        "test_transformers_replay's gpt2 case stays",
    "test_delta_fallback.py::test_delta_fallback_trains_gpt2_under_04_like_eager_within_its_arena_with_the_simulated"
    "_host_bytes[small]": "the copy-stream DELTA fallback test stays",
    "test_plan.py::test_three_optimizer_steps_equal_eager[store-all-transformer]": "the mlp and cnn cases stay",
    "test_plan.py::test_three_optimizer_steps_equal_eager[checkpoint-all-transformer]": "the mlp and cnn cases stay",
    "test_ddp.py::test_ddp_dynamic_plan_equals_ddp_eager_on_both_ranks": "the DDP static-plan test stays",
    "test_fallback.py::test_gpt2_trains_three_steps_at_half_the_baseline_peak[dtr]": "the coop case stays",
    "test_fallback.py::test_gpt2_trains_three_steps_at_half_the_baseline_peak[dtr-eq]": "the coop case stays",
    "test_fallback.py::test_gpt2_trains_three_steps_at_half_the_baseline_peak[dte]": "the coop case stays",
    "test_fallback.py::test_the_first_online_step_is_recorded_validated_and_replayed_like_eager_over_two_adamw_steps"
    "[gpt2-coop]": "the four cnn cases stay",
    "test_copy_stream.py::test_random_paging_schedules_keep_the_protocol[transformer]": "the mlp case stays",
    "test_copy_stream.py::test_hand_schedules_keep_the_protocol_and_every_wait_is_needed[transformer-3]":
        "transformer-1 and the mlp cases stay",
    "test_meta_capture.py::test_a_bfloat16_llama_with_its_own_heads_and_mlp_width_captures_on_meta_like_the_real_one":
        "the llama/bert/gpt2 meta-capture cases stay",
    "test_meta_capture.py::test_a_meta_capture_gives_the_real_models_graph[llama]": "mlp, cnn, transformer, gpt2 stay",
    "test_transformers_replay.py::test_plan_replays_bit_identically_over_adamw_steps[llama]":
        "llama-moccasin (the same llama), gpt2, silu and mish stay",
    "test_transformers_replay.py::test_plan_replays_bit_identically_over_adamw_steps[bert]":
        "gpt2, llama-moccasin, silu and mish stay",
    "test_transformers_replay.py::test_plan_replays_bit_identically_over_adamw_steps[qwen2]":
        "gpt2, llama-moccasin, silu and mish stay",
    "test_transformers_replay.py::test_plan_replays_bit_identically_over_adamw_steps[vit]":
        "gpt2, llama-moccasin, silu and mish stay",
    "test_fuzz_regressions.py::test_checkmate_solves_a_small_graph_within_a_short_limit[0.2-cbc]":
        "CBC at 0.5 and 1.0 s stays (CBC's process start-up alone took most of 0.2 s under load, twice in a row)",
    "test_arena_budget.py::test_small_distilbert_arena_plan_holds_within_its_budget":
        "the zoo arena-budget cases stay",
    # test_arena_budget: each of its three plans keeps the conv net (oneDNN's scratch, batch norm) and one attention
    # model in the fast tier, through the same meter and eager oracle
    **{f"test_arena_budget.py::test_every_zoo_ordinary_plan_holds_within_its_budget_without_profiling[{name}]":
       "cnn and gpt2 stay" for name in ("bert", "transformer", "mlp")},
    # the arena plan's attention model (10 s) and the profiled gpt2 (4 s) joined them on 2026-12-01, when the suite
    # took 8:45 on an Intel Xeon of 2 cores: the cnn keeps the arena plan (oneDNN's scratch in the arena) and the
    # profiled capture, and gpt2's unprofiled ordinary plan keeps an attention model under the same meter
    **{f"test_arena_budget.py::test_every_zoo_arena_plan_holds_within_its_budget[{name}]": "the cnn stays"
       for name in ("gpt2", "bert", "mlp", "transformer")},
    **{f"test_arena_budget.py::test_every_zoo_ordinary_plan_captured_with_profile_holds_within_its_budget[{name}]":
       "the cnn stays, and gpt2 without profiling" for name in ("bert", "transformer", "mlp", "gpt2")},
    "test_meta_capture.py::test_a_meta_capture_gives_the_real_models_graph[bert]": "mlp, cnn, transformer, gpt2 stay",
    # inductor compiles every kernel of these anew in a fresh clone (its cache is cold on CI): 19 s alone, 43 s beside
    # test_compile's fixture (2026-11-29); the walk's hand-built tests here and test_compile_order's allocator checks
    # stay in the fast tier
    **{f"test_inductor_buffers.py::test_observed_buffers_are_what_the_code_allocates_and_the_allocator_holds[{name}]":
       "the walk's hand-built tests and test_compile_order's allocator checks stay" for name in ("store-all",
                                                                                                "checkpoint-all")},
    "test_training_loop.py::test_three_adamw_steps_with_two_micro_batches_equal_eager[moccasin-transformer]":
        "six other cases stay",
    "test_training_loop.py::test_three_adamw_steps_with_two_micro_batches_equal_eager[checkmate-lp]":
        "six other cases stay",
    "test_training_loop.py::test_three_adamw_steps_with_two_micro_batches_equal_eager[pytorch-mincut]":
        "six other cases stay, and test_pytorch_mincut's cnn replay",
    "test_training_loop.py::test_three_adamw_steps_with_two_micro_batches_equal_eager[dynamic-transformer]":
        "the dynamic-cnn case stays",
    "test_pytorch_mincut.py::test_splits_replay_exactly_within_their_predicted_peak[transformer]": "the cnn case stays",
    "test_pytorch_mincut.py::test_every_split_is_a_legal_schedule_matching_the_modules[transformer]": "the cnn case stays",
    "test_graph_replay.py::test_three_adamw_steps_with_accumulation_equal_eager[transformer]": "mlp and cnn stay",
    "test_training_context.py::test_captured_and_stepped_under_autocast_equal_eager_autocast[chen-greedy]":
        "the dynamic case stays",
    "test_training_context.py::test_stepped_under_autocast_it_was_not_captured_in_warns_and_equals_eager_autocast"
    "[chen-greedy]": "the dynamic case stays",
    "test_executor.py::test_recomputed_random_ops_replay_their_draws_bit_for_bit[transformer]": "the mlp case stays",
    "test_executor.py::test_baseline_schedules_replay_exactly_within_prediction[transformer-checkpoint-all]":
        "ten other cases stay",
    "test_executor.py::test_baseline_schedules_replay_exactly_within_prediction[transformer-store-all]":
        "ten other cases stay",
    "test_plan.py::test_measured_peak_falls_with_the_budget[transformer]": "the cnn case stays",
    "test_cuda_dispatch.py::test_a_meta_capture_for_cuda_has_the_ops_the_h200_captured[resnet]": "the gpt2 case stays",
    "test_arena_replay.py::test_arena_training_is_bit_identical_and_allocates_only_the_buffer_once"
    "[resnet-checkpoint-all]": "nine other cases stay",
    "test_arena_replay.py::test_arena_training_is_bit_identical_and_allocates_only_the_buffer_once"
    "[mobilenet-store-all]": "nine other cases stay",
    "test_capture.py::test_baseline_peak_matches_metered_peak[mobilenet]": "eight other models stay",
    # MobileNetV2 (17 blocks at any image size: its capture alone took 9.5 s on 2 loaded cores): the conv nets with
    # batch norm (cnn, resnet) keep the capture's replay, flops and structure checks in the fast tier
    "test_capture.py::test_flops_match_flop_counter_on_eager_step[mobilenet]": "eight other models stay",
    "test_capture.py::test_replay_equals_eager_bit_for_bit[mobilenet]": "eight other models stay",
    "test_capture.py::test_graph_structure[mobilenet]": "eight other models stay",
    # the fast-tier durations of 2026-11-29 (one process beside a benchmark): 7-15 s each
    "test_plan.py::test_three_optimizer_steps_equal_eager[chen-sqrt-transformer]": "the mlp and cnn cases stay",
    "test_plan.py::test_three_optimizer_steps_equal_eager[chen-greedy-transformer]": "the mlp and cnn cases stay",
    "test_training_loop.py::test_three_adamw_steps_with_two_micro_batches_equal_eager[auto]":
        "five other cases stay (the accumulation replay is the same for every schedule; test_auto_ladder judges "
        "auto's plans against eager)",
    "test_alternatives_norm_forward.py::test_forward_inplace_is_bit_identical_to_the_fused_kernel[dtype1-2]":
        "float32 at 2 threads and float64 at 1 thread stay",
    "test_arena_replay.py::test_arena_training_is_bit_identical_and_allocates_only_the_buffer_once"
    "[gpt2-checkpoint-all]": "gpt2-store-all and cnn-checkpoint-all stay",
    "test_fuzz_regressions.py::test_poet_claims_no_proof_for_a_schedule_outside_its_stage_space":
        "POET's MILP proving its own space's optimum takes 8-18 s; test_poet's bound checks and bench_fuzz's POET "
        "rows (benchmarks) keep the claim that a bound never exceeds a schedule in hand",
}


#: The fast tier's longest test files (5 s or more each in a fresh clone's `make test`, from its timestamped logs,
#: 2026-11-29 and 2026-11-30), longest first; the compiling files (:data:`COMPILING_FILES`, one unit of about 100 s)
#: lead. Under `--dist loadfile` a pytest-xdist worker takes whole files (the compiling ones together), in the order of
#: the collection when xdist's own reorder (files with the most tests first) is off: starting with the long files
#: leaves the many short ones to even out the two workers' ends (a 19 s file last left the other worker idle for 14 s;
#: test_training_loop.py, 11 s, for 11 s).
LONG_FILES_FIRST = ("test_compile.py", "test_compile_order.py", "test_inductor_buffers.py", "test_compile_scratch.py",
                    "test_compile_inline_saved.py", "test_plan.py", "test_auto_ladder.py", "test_bench_cuda.py", "test_cli.py", "test_meta_capture.py",
                    "test_arena_budget.py", "test_poet.py", "test_fuzz_regressions.py", "test_transformers_replay.py",
                    "test_moccasin.py", "test_budget.py", "test_training_context.py", "test_fsdp.py",
                    "test_input_errors.py", "test_compile_pricing.py", "test_capture.py",
                    "test_alternatives_norm_forward.py", "test_executor.py",
                    "test_arena_replay.py", "test_reserved.py", "test_monet.py", "test_progress_api.py",
                    "test_checkmate.py", "test_blocks.py", "test_rounds.py", "test_baselines.py",
                    "test_alternatives_conv.py", "test_schedule.py", "test_pytorch_mincut.py",
                    "test_integrations_transformers.py", "test_deadline.py", "test_ddp.py", "test_graph_replay.py",
                    "test_bruteforce_oracle.py", "test_monet_intervals.py", "test_training_loop.py",
                    "test_integrations_lightning.py", "test_auto_rungs.py", "test_first_call_messages.py",
                    "test_predict_autograd.py", "test_fuzz_inputs.py", "test_online.py", "test_alternatives.py")


#: Files that compile kernels with inductor, run by one pytest-xdist worker as one unit (:func:`pytest_xdist_make_scheduler`):
#: inductor's first compilation in a process costs 11-13 s beyond the kernels (its modules, its code cache, the
#: precompiled header loaded), once per process that compiles, and the files' compilations share one in-process
#: cache.
COMPILING_FILES = ("test_compile.py", "test_compile_order.py", "test_inductor_buffers.py", "test_compile_scratch.py",
                   "test_compile_inline_saved.py", "test_compile_tangent.py")


@pytest.hookimpl(optionalhook=True)  # xdist's hook: pytest without xdist (`-p no:xdist`, bench_mutants) skips it
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object | None:
    """Under ``--dist loadfile`` (``make test``), xdist's file scheduling with :data:`COMPILING_FILES` as one unit.

    pytest-xdist's own ``loadgroup`` would do it with marks, but it renames the tests' node ids through an attribute
    that pytest 9 no longer reads (the marks are then ignored); its scheduler classes are its public extension point.
    """
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class CompilingFilesTogether(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            scope = super()._split_scope(nodeid)
            return "inductor" if Path(scope).name in COMPILING_FILES else scope

    return CompilingFilesTogether(config, log)


def pytest_configure(config: pytest.Config) -> None:
    """Hand files to pytest-xdist's workers in the collection's order (:data:`LONG_FILES_FIRST`)."""
    missing = [name for name in (*LONG_FILES_FIRST, *COMPILING_FILES) if not (Path(__file__).parent / name).is_file()]
    if missing:
        raise pytest.UsageError(f"tests/conftest.py LONG_FILES_FIRST names files that do not exist: {missing}")
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False


@pytest.hookimpl(tryfirst=True)  # before -k/-m deselect, so the stale check sees every collected test
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark :data:`SLOW_SIBLINGS` slow; name any entry that no longer matches a test, so the list cannot rot; put the
    :data:`LONG_FILES_FIRST` first."""
    rank = {name: index for index, name in enumerate(LONG_FILES_FIRST)}
    items.sort(key=lambda item: rank.get(Path(item.fspath).name, len(rank)))
    found = set()
    for item in items:
        key = f"{Path(item.fspath).name}::{item.name}"
        if key in SLOW_SIBLINGS:
            item.add_marker(pytest.mark.slow)
            found.add(key)
    collected_files = {Path(item.fspath).name for item in items}
    narrowed = {Path(arg.split("::")[0]).name for arg in config.args if "::" in arg}  # one test of a file asked for
    stale = [key for key in SLOW_SIBLINGS
             if key not in found and key.split("::")[0] in collected_files - narrowed]
    if stale:
        raise pytest.UsageError(f"tests/conftest.py SLOW_SIBLINGS names tests that do not exist: {stale}")
