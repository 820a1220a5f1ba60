from __future__ import annotations

import pytest

from tpuq.executor import layout


def test_status_names_parse_back():
    name = layout.worker_status_name("job-1", 3, 12)
    assert name.startswith(layout.STATUS_NOTIFICATION_PREFIX)
    assert layout.parse_status_object_name(name) == layout.StatusObjectRef("job-1", 3, 12)
    marker = layout.parse_status_object_name(layout.cancelled_marker_name("job-1", 3))
    assert marker == layout.StatusObjectRef("job-1", 3, None) and marker.is_cancel_marker


@pytest.mark.parametrize(
    "name",
    [
        layout.log_chunk_name("job-1", 3, 0, 0),
        "tpuq/status/job-1/3/worker-x.json",
        "tpuq/status/job-1/0/worker-1.json",
        "tpuq/status/Job/3/worker-1.json",
        "other/tpuq/status/job-1/3/worker-1.json",
    ],
)
def test_other_objects_are_not_status_objects(name):
    assert layout.parse_status_object_name(name) is None


def test_log_chunks_sort_by_name():
    names = [layout.log_chunk_name("j", 1, 0, seq) for seq in (10, 2, 100000, 0)]
    assert sorted(names) == [layout.log_chunk_name("j", 1, 0, s) for s in (0, 2, 10, 100000)]


def test_bucket_name_accepts_uri_or_name():
    assert layout.bucket_name("gs://abc") == layout.bucket_name("abc") == "abc"
    with pytest.raises(ValueError):
        layout.bucket_name("gs://abc/obj")
