"""Timers (docs/wire.md#timers): the /api/v1/timers routes and the op bodies that the transaction reuses."""
