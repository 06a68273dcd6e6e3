"""dlq_fill: copy dead letters' payloads out of their segments through ``queen.dlq_fill_v2``.

ack_v1 writes a dead letter with payload NULL: the payload sits in its segment as a QPF1 frame, mostly
zstd-compressed, which SQL cannot decompress. Nothing waits for this job: the DLQ list decodes unfilled
payloads itself and a requeue copies the segment's frame (queen.dlq_requeue_v1); the job makes the
payload readable as jsonb and lets retention drop the segment. Each call writes the payloads decoded
from the previous call's rows and hands out the next rows, so :meth:`DlqFill.more` keeps the loop
going while a decoded batch waits to be written. A dead letter whose segment is gone (retention waits
for it, so it should not happen) or unreadable gets JSON ``null`` and a logged warning, so it never blocks the loop.
The frame's producerSub goes along (``log_dlq.producer_sub``); an encrypted queue's payload is written
still sealed (``log_dlq.sealed``, payload JSON null): the job never opens it and needs no key.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import datetime

from queen_pg.db.pool import Database, Record
from queen_pg.engine import calls, codec
from queen_pg.jobs.supervisor import Job, JobConfig

log = logging.getLogger("queen_pg.jobs")

CONFIG = JobConfig(name="dlq_fill", interval=5.0, limit=100)
NULL_JSON = "null"


def payloads_by_offset(
    blob: bytes, base_offset: int, dropped: Sequence[int] | None, codec_id: int = codec.CODEC_ZSTD
) -> dict[int, codec.Frame]:
    """The frame of every message of a segment, by offset. Frame k (0-based) not listed in
    ``dropped`` has offset base_offset + (number of frames before it that are not dropped)."""
    skip = set(dropped or ())
    out: dict[int, codec.Frame] = {}
    offset = base_offset
    for k, frame in enumerate(codec.unpack(blob, codec_id)):
        if k in skip:
            continue
        out[offset] = frame
        offset += 1
    return out


def _as_text(payload: bytes) -> str:
    # PostgreSQL text cannot hold NUL; valid JSON never has a raw one (it escapes it as \u0000).
    return payload.decode("utf-8", "replace").replace("\x00", "\ufffd")


class DlqFill(Job):
    def __init__(self, config: JobConfig = CONFIG) -> None:
        super().__init__(config)
        self._ids: list[int] = []
        self._payloads: list[str] = []
        self._sealed: list[bytes | None] = []
        self._subs: list[str | None] = []

    def more(self, done: int) -> bool:
        """Call again at once while a decoded batch waits: the next call writes it."""
        return bool(self._ids)

    async def run_once(self, db: Database, now: datetime | None = None) -> int:
        """Dead letters handed out and decoded by one call (written by the next one)."""
        rows = await db.fetch(
            calls.DLQ_FILL, self._ids, self._payloads, self._sealed, self._subs, self.config.limit, now
        )
        # Written now; or, when another replica led this tick, nothing was written and those rows
        # are handed out again (still NULL) to whoever leads next.
        self._ids, self._payloads, self._sealed, self._subs = [], [], [], []
        segments: dict[tuple[int, int], dict[int, codec.Frame]] = {}
        missing = 0
        for row in rows:
            frame = self._decode(row, segments)
            if frame is None:
                missing += 1
                log.warning(
                    "event=dlq_payload_missing dlq_id=%d partition_id=%d offset=%d segment=%s",
                    row["id"],
                    row["partition_id"],
                    row["msg_offset"],
                    "gone" if row["base_offset"] is None else "unreadable",
                )
            self._ids.append(row["id"])
            sealed = frame is not None and frame.sealed
            self._payloads.append(NULL_JSON if frame is None or sealed else _as_text(frame.payload))
            self._sealed.append(frame.payload if frame is not None and sealed else None)
            self._subs.append(frame.producer_sub if frame is not None else None)
        if rows:
            log.info("event=job_done job=%s payloads=%d missing=%d", self.name, len(rows) - missing, missing)
        return len(rows)

    @staticmethod
    def _decode(row: Record, segments: dict[tuple[int, int], dict[int, codec.Frame]]) -> codec.Frame | None:
        if row["base_offset"] is None:
            return None
        key = (row["partition_id"], row["base_offset"])
        frames = segments.get(key)
        if frames is None:
            frames = {}
            if row["payload"] is not None:  # sent on the first row of each segment in a batch
                try:
                    frames = payloads_by_offset(row["payload"], row["base_offset"], row["dropped"], row["codec"])
                except Exception as exc:  # a corrupt blob must not block the loop
                    log.warning(
                        "event=dlq_segment_unreadable partition_id=%d base_offset=%d error=%s",
                        key[0],
                        key[1],
                        exc,
                    )
            segments[key] = frames
        return frames.get(row["msg_offset"])
