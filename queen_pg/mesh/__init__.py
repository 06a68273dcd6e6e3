"""The wake mesh: replicas (and the workers of one host) tell each other what changed.

Invariants:
- Nothing the mesh carries is authoritative. A WAKE says "queue Q of tenant T got messages" and
  only makes parked pops look now; MAINTENANCE asks for a re-read of the switches from PostgreSQL;
  CONFIG says a queue's configuration changed. A lost, late or replayed frame costs latency (the
  parked pop's own backed-off re-check, the maintenance refresher's timer), never a message.
- Every frame is HMAC-SHA256-signed with ``QUEEN_MESH_SECRET``; frames that fail the check are
  dropped, counted (``queen_mesh_frames_dropped_total``) and their connection closed. The handshake
  is a challenge-response (fresh nonces both ways), so a recorded HELLO, replayed, gets no connection.
- Publishing never waits: each peer has a bounded outbox; a slow or absent peer's frames are dropped.
- The engine never imports this package: it calls ``Waiters.notify``, and the mesh is one of its sinks.
"""

from queen_pg.mesh.frames import FrameError
from queen_pg.mesh.node import Mesh, MeshConfig
from queen_pg.setting_values import parse_peers

__all__ = ["FrameError", "Mesh", "MeshConfig", "parse_peers"]
