"""ActorPool: warm Ray actors kept between RaySessions.

::

    with ActorPool() as pool:              # one per test module, say
        for example in examples:
            with RaySession(pool=pool) as session:
                session.run(...)     # node actors taken from the pool,
                                     # reset (new name, empty workspace)
            # close(): live actors go back to the pool, their
            # workspaces dropped; dead ones are forgotten
    # pool.close(): every idle actor killed

Starting a Ray actor takes a fraction of a second to seconds; resetting
one takes a remote call.  Property tests open many short sessions, so
they take their node actors (and queue and fault-book actors) from a pool.
A session without a pool kills its actors at `close()`.

Actors are kept by kind and by their actor options (an actor started
with ``num_cpus=1`` is not handed to a node that asked for none); a
taken actor is reset by the session before use, and one that fails its
reset (it died while idle) is dropped for a new one.
"""

import collections
import threading

__all__ = ["ActorPool"]


class ActorPool:
    """Idle Ray actors by ``(kind, options key)``, and their pids."""

    def __init__(self):
        self._idle = collections.defaultdict(list)
        self._pids = {}              # id(handle) -> pid, when known
        self._lock = threading.Lock()
        self._closed = False

    def __repr__(self):
        return f"ActorPool({len(self)} idle{', closed' * self._closed})"

    def __len__(self):
        with self._lock:
            return sum(len(v) for v in self._idle.values())

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def take(self, kind, key):
        """``(handle, pid)`` of an idle actor, or None."""
        with self._lock:
            idle = self._idle.get((kind, key))
            if not idle:
                return None
            handle = idle.pop()
            return handle, self._pids.pop(id(handle), None)

    def give(self, kind, key, handle, pid=None):
        """Keep ``handle`` for a later session (killed if the pool is
        closed)."""
        with self._lock:
            if not self._closed:
                self._idle[(kind, key)].append(handle)
                if pid is not None:
                    self._pids[id(handle)] = pid
                return
        _kill(handle)

    def pids(self):
        """Pids of the idle actors whose pid is known."""
        with self._lock:
            return set(self._pids.values())

    def close(self):
        """Kill every idle actor; actors given back later are killed."""
        with self._lock:
            self._closed = True
            handles = [h for hs in self._idle.values() for h in hs]
            self._idle.clear()
            self._pids.clear()
        for handle in handles:
            _kill(handle)


def _kill(handle):
    import ray
    try:
        ray.kill(handle, no_restart=True)
    except Exception:  # noqa: BLE001 - dead already, or Ray gone
        pass
