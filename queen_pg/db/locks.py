"""Advisory-lock keys, mirrored from docs/locks.md (one named constant per key)."""

APPLY_LOCK = 7_781_200_001
