"""Test helper: the hypothesis strategy of ``daemon_sim.run_actions``' actions (requests, worker steps, worker
deaths, model loads), for the daemon's bookkeeping properties."""

from __future__ import annotations

from daemon_sim import MODELS
from hypothesis import strategies as st

ACTIONS = st.one_of(
    st.tuples(st.just("create")),
    st.tuples(st.just("generate"), st.integers(0, 3), st.integers(1, 4)),
    st.tuples(st.just("cancel"), st.integers(0, 7)),
    st.tuples(st.just("close"), st.integers(0, 3)),
    st.tuples(st.just("save"), st.integers(0, 3)),
    st.tuples(st.just("status")),
    st.tuples(st.just("set_budget"), st.sampled_from([0, 512, 4096])),
    st.tuples(st.just("reclaim"), st.sampled_from([0, 512])),
    st.tuples(st.just("gen_cancel")),  # a generate and its cancel in one poll tick
    st.tuples(st.just("shutdown")),
    st.tuples(st.just("load_model"), st.sampled_from(sorted(MODELS))),
    st.tuples(st.just("step"), st.integers(1, 6)),
    st.tuples(st.just("kill")),
)

#: Sessions, generations and steps only: mixed with ``ACTIONS`` (``st.one_of(CROWD, ACTIONS)``), half of the actions make
#: NPCs join and leave (the batch-tier switches' property)
CROWD = st.one_of(
    st.tuples(st.just("create")),
    st.tuples(st.just("generate"), st.integers(0, 3), st.integers(1, 4)),
    st.tuples(st.just("step"), st.integers(1, 6)),
)
