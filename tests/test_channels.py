"""The shared-memory queue channel on its own, between two processes."""

import multiprocessing
import threading

import numpy as np
import pytest

from localcluster.runtime import shm
from localcluster.runtime.executor import Cancelled
from localcluster.runtime.shm_channel import ChannelParts, ShmChannel

FORK = multiprocessing.get_context("fork")


def _produce(desc, n, size):
    channel = ShmChannel(desc)
    values, index = np.zeros(size), np.zeros(1, dtype=np.int64)
    for i in range(n):
        values[0] = values[-1] = index[0] = i
        channel.put((values, index))
    channel.close()


@pytest.fixture
def parts():
    made = ChannelParts(shm.session_prefix() + "qtest_", 8)
    yield made
    made.close()
    assert not shm.segments(made.prefix)


# Many small records keep both sides busy on the shared words at once.
@pytest.mark.parametrize("n,size", [(20000, 1), (40, 1 << 17)])
def test_records_arrive_complete_and_in_order(parts, n, size):
    producer = FORK.Process(target=_produce, args=(parts.desc, n, size))
    producer.start()
    channel = ShmChannel(parts.desc)
    # bounded: a broken channel ends in Cancelled, not a hang
    watchdog = threading.Timer(20, channel.abort)
    watchdog.start()
    try:
        got = 0
        while True:
            records, finished = channel.get(3)
            if finished:
                break
            assert records, "an empty read of a queue that is not finished"
            for values, index in records:
                assert index[0] == got and values.shape == (size,)
                assert values[0] == got and values[-1] == got
                got += 1
        assert got == n
    finally:
        watchdog.cancel()
        producer.kill()
        producer.join(10)
        channel.release()


def test_a_reset_channel_is_empty_and_open_again(parts):
    channel = ShmChannel(parts.desc)
    try:
        assert channel.put((np.arange(3),))
        channel.close()
        assert not channel.put((np.arange(3),))
        parts.reset()
        channel.begin()
        assert channel.put((np.arange(4),))
        (record,), finished = channel.get(1)
        assert not finished and list(record[0]) == [0, 1, 2, 3]
    finally:
        channel.release()


def test_an_aborted_wait_raises_cancelled(parts):
    channel = ShmChannel(parts.desc)
    try:
        channel.abort()
        with pytest.raises(Cancelled):
            channel.get(1)
    finally:
        channel.release()
