"""A serving process tunes its garbage collector (queen_pg/server.py ``tune_gc``): the thresholds from
QUEEN_GC_THRESHOLDS and the start-up objects frozen; empty keeps Python's thresholds; a malformed value
is refused at boot."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest
from pydantic import ValidationError

from queen_pg.server import tune_gc
from queen_pg.settings import Settings


@pytest.fixture
def restored_gc() -> Iterator[None]:
    before = gc.get_threshold()
    try:
        yield
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)


def test_serve_tunes_the_collector_and_freezes_start_up_objects(restored_gc: None) -> None:
    gc.set_threshold(700, 10, 10)
    tune_gc(Settings())
    assert gc.get_threshold() == (10_000, 10, 100)
    assert gc.get_freeze_count() > 1000  # the modules, the app, its routes


def test_empty_thresholds_keep_pythons(restored_gc: None) -> None:
    gc.set_threshold(700, 10, 10)
    tune_gc(Settings(gc_thresholds=""))
    assert gc.get_threshold() == (700, 10, 10)


@pytest.mark.parametrize("bad", ["10000,10", "a,b,c", "1,2,3,4"])
def test_a_malformed_threshold_is_refused(bad: str) -> None:
    with pytest.raises(ValidationError):
        Settings(gc_thresholds=bad)
