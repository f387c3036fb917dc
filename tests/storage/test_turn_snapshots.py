"""Paused snapshots kept for their resume: used once, at the version they were written
with, and only within the count and size the replica keeps."""

from __future__ import annotations

from genkit.exp import SessionSnapshot

from storage import turn_snapshots
from storage.turn_snapshots import WRITTEN_AS, KeptSnapshots, resuming


def snapshot(sid: str) -> SessionSnapshot:
    return SessionSnapshot(snapshot_id=sid, created_at="")


def test_a_kept_snapshot_serves_one_resume_at_its_written_version() -> None:
    kept = KeptSnapshots()
    kept.keep("T1", snapshot("s1"), 100)
    assert kept.for_resume("T1", "s1") is None  # no resume running: left alone
    with resuming("s1", None):  # a claim that read no version: not known to be current
        assert kept.for_resume("T1", "s1") is None
    with resuming("s1", WRITTEN_AS):
        assert kept.for_resume("T2", "s1") is None  # another workspace's id
        found = kept.for_resume("T1", "s1")
        assert found is not None and found.snapshot_id == "s1"
        assert kept.for_resume("T1", "s1") is None  # used once


def test_a_snapshot_changed_since_it_was_kept_is_dropped_not_used() -> None:
    kept = KeptSnapshots()
    kept.keep("T1", snapshot("s1"), 100)
    with resuming("s1", WRITTEN_AS + 1):
        assert kept.for_resume("T1", "s1") is None
    with resuming("s1", WRITTEN_AS):
        assert kept.for_resume("T1", "s1") is None  # gone: a retry loads afresh


def test_the_oldest_go_past_the_count_or_the_bytes_and_a_big_one_is_not_kept() -> None:
    kept = KeptSnapshots()
    kept.keep("T1", snapshot("big"), turn_snapshots.KEPT_ONE_BYTES + 1)
    for i in range(turn_snapshots.KEPT + 1):
        kept.keep("T1", snapshot(f"s{i}"), 1)
    share = turn_snapshots.KEPT_ONE_BYTES
    for i in range(turn_snapshots.KEPT_BYTES // share):  # each as big as may be kept
        kept.keep("T1", snapshot(f"b{i}"), share)
    kept.keep("T1", snapshot("last"), share)
    with resuming("big", WRITTEN_AS):
        assert kept.for_resume("T1", "big") is None
    with resuming("s0", WRITTEN_AS):
        assert kept.for_resume("T1", "s0") is None  # past the count
    with resuming("b0", WRITTEN_AS):
        assert kept.for_resume("T1", "b0") is None  # past the bytes
    with resuming("b1", WRITTEN_AS):
        assert kept.for_resume("T1", "b1") is not None
    with resuming("last", WRITTEN_AS):
        assert kept.for_resume("T1", "last") is not None
