"""The benchmark suite (``make bench``): ``run.py`` starts a broker and drives it with ``loadgen.py``.

Invariants: the load generator is a separate process that only speaks HTTP to the broker (it imports
nothing from ``queen_pg``); every run is bounded in time; targets are reported, never asserted.
"""
