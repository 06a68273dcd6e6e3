"""Measuring peers: other PostgreSQL-backed queues driven on our scenarios' shapes in the same sitting,
so every figure of ours has a ratio that does not depend on how fast the host was that hour.

Invariants: a peer runs only in a throwaway database of the PostgreSQL the harness started (never in
the broker's database) that is dropped afterwards; its SQL is kept here unchanged with its licence;
its load generator is a separate process, like ours.
"""
