"""The table of live storages: which storages exist now, found without keeping any alive.

A storage is identified by its StorageImpl address. For every storage in the table we
hold a weak reference: it never delays the release of the bytes, and it keeps the
StorageImpl object itself from being deleted, so its address cannot be handed to a new
storage while the entry exists. A storage is dead exactly when its weak reference has
expired, which is the moment the caching allocator (or the CPU allocator) got the bytes
back. `collect_dead` is called before every allocation the recorder writes, so frees
are ordered correctly relative to allocations.

Not thread-safe by itself; the recorder calls it holding its own lock, from whichever
thread runs the ops (autograd's device threads included).
"""

from ._torch_compat import free_weak_ref, new_weak_ref, weak_ref_expired


class StorageTable:
    def __init__(self):
        self._live = {}  # storage id -> AllocRecord

    def __len__(self):
        return len(self._live)

    def get(self, key):
        return self._live.get(key)

    def add(self, key, storage, record):
        """Starts tracking `storage` (whose id is `key`) as `record`."""
        record.weak_ref = new_weak_ref(storage)
        self._live[key] = record

    def replace(self, key, record):
        """Gives the live storage `key` a new record (its size changed in place); returns the old one."""
        old = self._live[key]
        record.weak_ref, old.weak_ref = old.weak_ref, 0
        self._live[key] = record
        return old

    def discard(self, key):
        """Stops tracking storage `key` (its bytes were released in place); returns its record."""
        record = self._live.pop(key)
        free_weak_ref(record.weak_ref)
        record.weak_ref = 0
        return record

    def collect_dead(self):
        """Removes and returns the records of storages released since the last call."""
        expired = weak_ref_expired
        dead_keys = [key for key, record in self._live.items() if expired(record.weak_ref)]
        dead = []
        for key in dead_keys:
            record = self._live.pop(key)
            free_weak_ref(record.weak_ref)
            record.weak_ref = 0
            dead.append(record)
        return dead

    def release(self):
        """Drops every weak reference; the table is empty afterwards."""
        for record in self._live.values():
            free_weak_ref(record.weak_ref)
            record.weak_ref = 0
        self._live.clear()
