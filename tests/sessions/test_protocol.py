"""The pipe framing of `_protocol`: the same bytes as multiprocessing's
Connection, read and written with plain os calls."""

import multiprocessing
import os
import pickle
import threading

import pytest

from localcluster.sessions import _protocol as P


@pytest.fixture
def pair():
    a, b = multiprocessing.Pipe(duplex=True)
    yield a, b
    a.close()
    b.close()


@pytest.mark.parametrize("size", [0, 100, P._ONE_WRITE, 3 * 2 ** 20])
def test_messages_travel_both_ways_and_mix_with_connection_calls(pair, size):
    a, b = pair
    msg = ("run", 7, b"x" * size, {"trace": False})
    got = []
    reader = threading.Thread(target=lambda: got.extend(
        [P.recv(b), b.recv()]))
    reader.start()   # big messages need a reader while they are written
    P.send(a, msg)
    a.send(msg)
    reader.join(30)
    assert got == [msg, msg]
    writer = threading.Thread(target=lambda: (P.send(b, msg), b.send(msg)))
    writer.start()
    assert P.recv(a) == msg and P.recv(a) == msg
    writer.join(30)


def test_a_message_arriving_in_pieces_is_read_whole(pair):
    a, b = pair
    data = pickle.dumps(("ok", 1, list(range(1000))))
    frame = P._SIZE.pack(len(data)) + data
    fd = a.fileno()

    def trickle():
        for i in range(0, len(frame), 7):
            os.write(fd, frame[i:i + 7])

    writer = threading.Thread(target=trickle)
    writer.start()
    assert P.recv(b) == ("ok", 1, list(range(1000)))
    writer.join(30)


def test_end_of_file_is_eof_before_a_message_and_oserror_inside_one(pair):
    a, b = pair
    os.write(a.fileno(), P._SIZE.pack(100) + b"partial")
    a.close()
    with pytest.raises(OSError):
        P.recv(b)
    with pytest.raises(EOFError):
        P.recv(b)
    with pytest.raises(OSError):
        P.send(a, ("closed",))


def test_a_reader_takes_messages_that_came_in_one_read_or_in_pieces(pair):
    a, b = pair
    reader = P.Reader(b)
    small = [("run", i, None, {}) for i in range(5)]
    big = ("run", 9, b"y" * (3 * P.Reader.CHUNK), {})
    for msg in small[:3]:
        P.send(a, msg)   # queued together: one read takes all three
    assert [reader.recv() for _ in range(3)] == small[:3]
    frame = b"".join(P._SIZE.pack(len(d)) + d for d in
                     (pickle.dumps(m) for m in small[3:] + [big]))

    def trickle():
        for i in range(0, len(frame), 5000):
            os.write(a.fileno(), frame[i:i + 5000])

    writer = threading.Thread(target=trickle)
    writer.start()
    assert [reader.recv() for _ in range(3)] == small[3:] + [big]
    writer.join(30)
    a.send(small[0])     # Connection's own framing reads the same
    assert reader.recv() == small[0]


def test_a_reader_raises_eof_between_messages_and_oserror_inside_one(pair):
    a, b = pair
    reader = P.Reader(b)
    P.send(a, ("ok", 1))
    os.write(a.fileno(), P._SIZE.pack(50) + b"cut")
    a.close()
    assert reader.recv() == ("ok", 1)
    with pytest.raises(OSError):
        reader.recv()
    a2, b2 = multiprocessing.Pipe()
    a2.close()
    with pytest.raises(EOFError):
        P.Reader(b2).recv()
    b2.close()
