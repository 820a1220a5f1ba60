from __future__ import annotations

import pytest

from tpuq.contracts import gcslayout


def test_status_names_parse_back():
    name = gcslayout.worker_status_name("job-1", 3, 12)
    assert name.startswith(gcslayout.STATUS_NOTIFICATION_PREFIX)
    assert gcslayout.parse_status_object_name(name) == gcslayout.StatusObjectRef("job-1", 3, 12)
    marker = gcslayout.parse_status_object_name(gcslayout.cancelled_marker_name("job-1", 3))
    assert marker == gcslayout.StatusObjectRef("job-1", 3, None) and marker.is_cancel_marker


@pytest.mark.parametrize(
    "name",
    [
        gcslayout.log_chunk_name("job-1", 3, 0, 0),
        "tpuq/status/job-1/3/worker-x.json",
        "tpuq/status/job-1/0/worker-1.json",
        "tpuq/status/Job/3/worker-1.json",
        "other/tpuq/status/job-1/3/worker-1.json",
    ],
)
def test_other_objects_are_not_status_objects(name):
    assert gcslayout.parse_status_object_name(name) is None


def test_log_chunks_sort_by_name():
    names = [gcslayout.log_chunk_name("j", 1, 0, seq) for seq in (10, 2, 100000, 0)]
    assert sorted(names) == [gcslayout.log_chunk_name("j", 1, 0, s) for s in (0, 2, 10, 100000)]


def test_bucket_name_accepts_uri_or_name():
    assert gcslayout.bucket_name("gs://abc") == gcslayout.bucket_name("abc") == "abc"
    with pytest.raises(ValueError):
        gcslayout.bucket_name("gs://abc/obj")
