"""Each of N copies started on one machine gets its share of the cores for its math libraries'
thread pools, unless the user set them."""

from __future__ import annotations

import os

from hopbus.runtime.env import THREAD_VARS, thread_share


def test_each_copy_gets_its_share_of_the_cores():
    cores = len(os.sched_getaffinity(0))
    assert thread_share(2, {}) == dict.fromkeys(THREAD_VARS, str(max(1, cores // 2)))
    assert thread_share(10 * cores, {}) == dict.fromkeys(THREAD_VARS, "1")  # never 0


def test_the_users_setting_and_a_single_copy_are_left_alone():
    assert thread_share(4, {"OMP_NUM_THREADS": "8"}) == {}
    assert thread_share(4, {"MKL_NUM_THREADS": "2", "PATH": "/bin"}) == {}
    assert thread_share(1, {}) == {}
    # an empty value is no setting: the libraries take it as unset, and so does hopbus
    assert thread_share(2, {"OMP_NUM_THREADS": ""}) == thread_share(2, {})
