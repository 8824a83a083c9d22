"""Seed 002's create-attempt lifecycle is realized on the one effect model (ARCHITECTURE.md section 4).

Every edge of the seed 002 table maps to listed transitions (or inserts in an
initial state) of RemoteEffect, RemoteEffectAttempt, DispatchPermit and
RemoteLink, or to a documented non-lifecycle realization; nothing else.
"""
from connectors import transitions as ct
from nexusflow.kernel.transitions import load_all_machines

MACHINES = load_all_machines()


def test_every_seed_002_edge_has_a_realization():
    assert set(ct.PUSH_ATTEMPT_REALIZATION) == set(ct.PUSH_ATTEMPT_STATUS.pairs())


def test_each_realization_step_is_a_listed_transition_or_an_initial_insert():
    for edge, steps in ct.PUSH_ATTEMPT_REALIZATION.items():
        if not steps:
            assert ct.REALIZED_ELSEWHERE.get(edge), f"{edge} has neither steps nor a documented realization"
            continue
        assert edge not in ct.REALIZED_ELSEWHERE
        for name, src, dst in steps:
            machine = MACHINES[name]
            if src is None:
                assert dst in machine.initial, f"{edge}: {name} cannot be inserted in {dst}"
            else:
                assert machine.allows(src, dst), f"{edge}: {name} {src} -> {dst} is not listed"


def test_io_boundary_matches_the_seed_002_states():
    # `post_sent` and later can only follow the Permit's granted -> sending (io_may_have_started).
    for (src, dst), steps in ct.PUSH_ATTEMPT_REALIZATION.items():
        if dst in {"post_sent", "writeback_pending", "ambiguous_remote_effect"} and src == "processing":
            assert ("connectors.DispatchPermit", "granted", "sending") in steps or \
                ("connectors.DispatchPermit", "sending", "abandoned") in steps
    # Returning to `pending` is only allowed while the Permit is provably pre-I/O.
    assert ("connectors.DispatchPermit", "granted", "abandoned") in ct.PUSH_ATTEMPT_REALIZATION[("processing", "pending")]
