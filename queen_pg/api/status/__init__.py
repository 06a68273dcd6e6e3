"""Status and operations: status, resources, analytics, maintenance switches, metrics."""
