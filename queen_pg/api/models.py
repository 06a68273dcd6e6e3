"""Request bodies (WIRE.md field names). Strict types: a wrong type is a 400, never a coercion."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr


class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore")


class PushItem(_Body):
    queue: StrictStr
    partition: StrictStr = "Default"
    payload: Any = None
    data: Any = None
    transactionId: StrictStr | None = None
    traceId: StrictStr | None = None


class PushBody(_Body):
    items: list[PushItem] = Field(min_length=1)


class AckItem(_Body):
    transactionId: StrictStr = Field(min_length=1)
    partitionId: StrictStr | StrictInt
    status: StrictStr = "completed"
    error: StrictStr | None = None
    consumerGroup: StrictStr | None = None
    leaseId: StrictStr | None = None


class AckBatchBody(_Body):
    acknowledgments: list[AckItem]
    consumerGroup: StrictStr | None = None


class QueueOptions(BaseModel):
    """Known options are type-checked; unknown keys are kept as given."""

    model_config = ConfigDict(extra="allow")

    leaseTime: StrictInt | None = Field(None, ge=1, le=7 * 86400)
    retryLimit: StrictInt | None = Field(None, ge=0, le=1_000_000)
    priority: StrictInt | None = None
    delayedProcessing: StrictInt | None = Field(None, ge=0)
    windowBuffer: StrictInt | None = Field(None, ge=0)
    maxSize: StrictInt | None = Field(None, ge=0)
    retentionSeconds: StrictInt | None = Field(None, ge=0)
    completedRetentionSeconds: StrictInt | None = Field(None, ge=0)
    dedupWindowSeconds: StrictInt | None = Field(None, ge=0)
    encryptionEnabled: StrictBool | None = None


class ConfigureBody(_Body):
    queue: StrictStr
    namespace: StrictStr | None = None
    task: StrictStr | None = None
    options: QueueOptions = Field(default_factory=lambda: QueueOptions())
