"""The free-disk check before a model download: the need, the margin, what a resume does not fetch again."""

import pytest
from ansible_collections.vllm_ops.cluster.plugins.module_utils.model import space

GIB = space.GIB
PATH = "/var/lib/vllm-cluster/models/llama-3.1-70b"


def test_a_model_that_does_not_fit_is_refused_naming_host_path_need_and_free():
    result = space.space_check("node-c", PATH, total_bytes=140 * GIB, free_bytes=100 * GIB)
    assert not result["fits"]
    assert result["margin_bytes"] == 7 * GIB and result["need_bytes"] == 147 * GIB
    assert result["message"] == (
        f"host node-c: {PATH} needs 147.00 GiB (the model's 140.00 GiB, plus a margin of 7.00 GiB) and its "
        "filesystem has 100.00 GiB free: 47.00 GiB short, before any download")


def test_the_margin_is_a_fraction_of_the_model_with_a_floor():
    small = space.space_check("n", PATH, total_bytes=GIB, free_bytes=10 * GIB)
    assert small["margin_bytes"] == space.DEFAULT_MARGIN_MIN_BYTES and small["need_bytes"] == 3 * GIB
    assert small["fits"]
    exact = space.space_check("n", PATH, total_bytes=100 * GIB, free_bytes=110 * GIB, margin_fraction=0.1,
                              margin_min_bytes=0)
    assert exact["need_bytes"] == 110 * GIB and exact["fits"]
    one_byte_short = space.space_check("n", PATH, total_bytes=100 * GIB, free_bytes=110 * GIB - 1,
                                       margin_fraction=0.1, margin_min_bytes=0)
    assert not one_byte_short["fits"]


def test_a_resume_needs_only_what_is_still_to_fetch():
    # 140 GiB model, 120 GiB of complete files there, 30 GiB free: 20 GiB to fetch + 7 GiB margin fits.
    resumed = space.space_check("node-b", PATH, total_bytes=140 * GIB, free_bytes=30 * GIB, present_bytes=120 * GIB)
    assert resumed["fits"] and resumed["remaining_bytes"] == 20 * GIB and resumed["need_bytes"] == 27 * GIB
    fresh = space.space_check("node-b", PATH, total_bytes=140 * GIB, free_bytes=30 * GIB)
    assert not fresh["fits"]
    tight = space.space_check("node-b", PATH, total_bytes=140 * GIB, free_bytes=26 * GIB, present_bytes=120 * GIB)
    assert not tight["fits"] and "(20.00 GiB still to fetch of 140.00 GiB, plus a margin of 7.00 GiB)" in \
        tight["message"]


def test_a_complete_model_fits_on_a_full_disk():
    done = space.space_check("n", PATH, total_bytes=140 * GIB, free_bytes=0, present_bytes=140 * GIB)
    assert done["fits"] and done["need_bytes"] == 0
    assert done["message"] == f"host n: {PATH}: the model is complete, nothing to fetch"


@pytest.mark.parametrize("given, message", [
    ({"total_bytes": -1}, "total_bytes must be a whole number"),
    ({"free_bytes": 1.5}, "free_bytes must be a whole number"),
    ({"present_bytes": True}, "present_bytes must be a whole number"),
    ({"margin_fraction": 1.0}, "margin_fraction must be at least 0 and below 1"),
    ({"present_bytes": 11}, "host n: .*: 11 bytes present of a model of 10"),
])
def test_impossible_inputs_are_refused(given, message):
    with pytest.raises(ValueError, match=message):
        space.space_check("n", PATH, **{"total_bytes": 10, "free_bytes": 10, **given})


def test_sizes_below_one_gib_read_in_mib():
    result = space.space_check("node2", "/srv/models/tiny", 1_470_989, 1_048_576, margin_min_bytes=2 * 1024 ** 3)
    assert not result["fits"]
    assert result["message"] == (
        "host node2: /srv/models/tiny needs 2.00 GiB (the model's 1.4 MiB, plus a margin of 2.00 GiB) and its "
        "filesystem has 1.0 MiB free: 2.00 GiB short, before any download")
