"""The chaos test runs with ``make chaos`` (QUEEN_CHAOS=1): about two minutes, three replicas, HAProxy."""

import os

collect_ignore = [] if os.environ.get("QUEEN_CHAOS") else ["test_chaos.py"]
