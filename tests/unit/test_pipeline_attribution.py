"""Check 2's attribution inside a pipeline stage's TP group (sdc_agent.checks.replay.pipeline):
the pairs whose ordered local results diverged first name the GPU, not its TP group.

The layout is the 3-D drill's: 3 nodes x 4 ranks, 2 stages x TP 2 per replica, so 6 pipelines
(one per TP rank of a node's stages); pipeline coordinate 0 is held by ranks 0, 1, 4, 5, 8, 9
and coordinate 1 by ranks 2, 3, 6, 7, 10, 11 (by pipeline replica), and ``peer_offset`` 2 makes
each TP group replay the next node's.
"""

from __future__ import annotations

import torch

from sdc_agent.checks.gradients.stats import GradStatsState
from sdc_agent.checks.replay.pipeline import (
    PipelineComparison,
    earliest_in_stages,
    ordered_local_results,
    tp_group_ids,
)

COLUMNS = [[0, 1, 4, 5, 8, 9], [2, 3, 6, 7, 10, 11]]
GROUPS = [(0, 1), (2, 3), (4, 5), (6, 7), (8, 9), (10, 11)]
"""Every stage's TP groups, the job's (PipelineAdapter.compute_groups)."""

# Rank 3 (replica 1, coordinate 1) computes a wrong column-parallel output; the TP all-reduce
# carries it to rank 2 (replica 0), in training and in its replays. At coordinate 1 the replica
# pairs (target, replayer) that diverge locally are then rank 3's, (1, 5) and (3, 1), and its
# partner's, (0, 4) and (2, 0); rank 3's differ at its 4th local result, rank 2's only at its
# 8th (after the all-reduce).
LOCAL = {0: [], 1: [(0, 4), (1, 5), (2, 0), (3, 1)]}
FIRST = {0: {}, 1: {(0, 4): 7, (1, 5): 3, (2, 0): 7, (3, 1): 3}}


def test_each_ranks_tp_group_is_known_at_every_pipeline_coordinate():
    # Given the job's TP groups
    # When they are laid out along each stage's ring of replicas
    ids = tp_group_ids(COLUMNS, GROUPS)
    # Then the two ranks of a group share an id, and groups of different stages differ
    assert ids == [[0, 0, 2, 2, 4, 4], [1, 1, 3, 3, 5, 5]]
    # And a rank in no TP group gets an id of its own
    assert tp_group_ids([[0, 1]], [(0,)]) == [[0, 2]]


def test_only_the_pairs_that_diverged_first_in_a_stage_are_kept():
    # Given rank 3's fault reaching its TP partner through the all-reduce
    # When the pairs of each stage are narrowed to the earliest local divergence
    kept = earliest_in_stages(LOCAL, FIRST, tp_group_ids(COLUMNS, GROUPS))
    # Then only rank 3's two pairs remain (rank 2's diverged later, through the collective)
    assert kept == {0: [], 1: [(1, 5), (3, 1)]}
    # And pairs that diverged at the same index are all kept (nothing tells them apart)
    tied = {1: {pair: 5 for pair in LOCAL[1]}}
    assert earliest_in_stages({1: LOCAL[1]}, tied, tp_group_ids(COLUMNS, GROUPS)) == {1: LOCAL[1]}


def test_ranks_alone_in_their_group_keep_every_pair():
    # Given no tensor parallelism: each rank is alone in its group
    ids = tp_group_ids(COLUMNS, [])
    # When the same divergences are narrowed
    kept = earliest_in_stages(LOCAL, FIRST, ids)
    # Then every pair is kept
    assert kept == LOCAL


def test_the_narrowed_comparison_names_the_one_gpu_as_culprit():
    # Given the stage-by-stage comparison of the whole TP group's divergence: replicas 0 and 1
    # are both in two mismatches (both culprits, the whole TP group)
    found = PipelineComparison(
        local=LOCAL,
        culprits={0: [], 1: [0, 1]},
        disputed={0: [], 1: []},
        unexplained={0: [], 1: []},
    )
    # When it keeps the pairs that diverged first
    narrowed = found.keeping(earliest_in_stages(LOCAL, FIRST, tp_group_ids(COLUMNS, GROUPS)))
    # Then replica 1 alone is the culprit: rank 3, the one GPU
    assert narrowed.culprits == {0: [], 1: [1]}
    assert [COLUMNS[1][r] for r in narrowed.culprits[1]] == [3]
    assert narrowed.disputed == {0: [], 1: []} and not narrowed.agreed
    # And a pair of the kept ones that no culprit explains is disputed (a confirmation settles it)
    once = found.keeping({0: [], 1: [(1, 5)]})
    assert once.culprits == {0: [], 1: []} and once.disputed == {0: [], 1: [(1, 5)]}


def test_ordered_local_results_are_the_recorded_events_in_order():
    # Given a step's statistics with the TP probes recording, and one without
    recording = GradStatsState(process_group=None, param_index={}, records_events=True)
    recording.arm(capture_fingerprints=True, device=torch.device("cpu"))
    events = [torch.tensor([1, 2]), torch.tensor([3, 4])]
    for event in events:
        recording.add_local_event(event)
    plain = GradStatsState(process_group=None, param_index={})
    plain.arm(capture_fingerprints=True, device=torch.device("cpu"))
    # Then the first's results are its events in order, the second's an empty table
    assert ordered_local_results(recording).tolist() == [[1, 2], [3, 4]]
    assert ordered_local_results(plain).shape == (0, 2)
