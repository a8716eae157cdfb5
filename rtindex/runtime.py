"""What a Database hands down to its collections and shards: shared resources and settings.

Collections and shards never reach back up to the Database; everything they share (the
workers, the caches, the limits, the role of this process) comes through one Runtime.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from rtindex.background import Worker
from rtindex.chunkcache import ChunkCache
from rtindex.documents import Limits
from rtindex.notify import Wake
from rtindex.rowcache import RowStoreCache
from rtindex.segments import ShardConfig
from rtindex.reader import ShardReader
from rtindex.shard import Shard
from rtindex.storage import WriteBuffers
from rtindex.writer import ShardWriter


@dataclass
class Runtime:
    config: ShardConfig
    limits: Limits
    row_cache: RowStoreCache
    column_cache: ChunkCache
    block_cache: Any
    write_buffers: WriteBuffers
    sync: bool = False
    sealer: Worker | None = None  # the writer's background threads
    merger: Worker | None = None
    secondary_root: str | None = None  # a reader's: where its RocksDB secondaries keep their own files
    wake: Wake | None = None  # the database's wake-up word (the writer rings it, readers wait on it)
    # the writer's indexer threads (single-thread executors): ingest indexes and writes shard s
    # on indexers[s % len(indexers)], so one shard's puts stay in order while another's run
    indexers: tuple = ()

    @property
    def reader(self) -> bool:
        return self.secondary_root is not None

    def open_shard(self, path: str, index: int, *, create: bool) -> Shard:
        if self.reader:
            name = os.path.relpath(path, os.path.dirname(os.path.dirname(path))).replace(os.sep, "-")
            return ShardReader(path, index, self.config, self.row_cache, self.column_cache,
                               block_cache=self.block_cache, secondary_path=os.path.join(self.secondary_root, name))
        return ShardWriter(path, index, self.config, self.sealer, self.merger, self.row_cache, self.column_cache,
                           create=create, sync=self.sync, block_cache=self.block_cache, write_buffers=self.write_buffers,
                           wake=self.wake)
