"""The KV store (docs/wire.md#kv): POST /api/v1/kv, its browse routes, and the op bodies that the
transaction reuses."""
