"""Type stub of the compiled mutable segment builder (twin of rtindex._py.segment)."""

from array import array
from typing import Any

import pyarrow as pa

class SegmentBuilder:
    """In-memory postings and column values of the newest rows of one shard."""

    max_depth: int
    def __init__(self, max_depth: int = 64) -> None: ...
    @property
    def n_rows(self) -> int:
        """Rows added so far."""
    @property
    def nbytes(self) -> int:
        """Memory held: term table, per-term arrays and strs, postings, column buffers, path nodes."""
    def add(self, doc: dict[str, Any]) -> int:
        """Index ``doc`` as the next row; returns its offset. All or nothing on SchemaError."""
    def add_columns(self, names: list[str], arrays: list[pa.Array]) -> int:
        """Index the rows of ``arrays`` (the columns ``names``) as the next rows, exactly as
        ``add`` would one by one; returns the offset of the first. All or nothing."""
    def postings(self, term: bytes, limit: int) -> array:
        """Offsets (< ``limit``) of the rows holding ``term``, increasing; a new array('I')."""
    def column_terms(self, column_key: bytes) -> list[bytes]:
        """Every distinct term of one column key (path + type), in no particular order."""
    def column_keys(self) -> list[bytes]:
        """Column keys (path + type) that have at least one term, in first-term order."""
    def sorted_postings(self) -> list[tuple[bytes, array]]:
        """All (term, offsets) pairs sorted by term: what a seal writes."""
    def columns(self) -> list[tuple[bytes, array, pa.Array]]:
        """(column key, offsets, Arrow values) for every column with values, sorted by column key."""
    def column(self, column_key: bytes, limit: int) -> tuple[array, pa.Array]:
        """(offsets, Arrow values) of one column's rows with offset < ``limit``: new arrays."""
    def column_size(self, column_key: bytes, limit: int) -> int:
        """How many rows with offset < ``limit`` have a value in this column (no copy)."""
    def write_blocks(self, target_bytes: int = 16384) -> list[tuple[bytes, bytes]]:
        """The term blocks of a seal: what ``BlockWriter(target_bytes)`` makes of ``sorted_postings()``."""
    def _test_fail_commit_at(self, n: int) -> None:
        """Tests only: make ``add`` raise MemoryError before resolving its ``n``-th term, and
        ``add_columns`` before indexing its ``n``-th value (column after column)."""
