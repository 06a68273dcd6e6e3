"""Administration: configure and delete queues, health, consumer groups, the legacy admin moves."""
