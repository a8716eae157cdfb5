"""Type stub of the compiled point lookup (twin of rtindex._py.point)."""

from typing import Any, Callable

class PointLookup:
    """One snapshot's views, laid out for point queries (see ``rtindex._py.point``)."""

    def __init__(self, views: list[tuple], shards: list[tuple[int, Callable[[list[int]], list[bytes]]]],
                 cache: Any, row_max: int, bytes_per_json_byte: int, entry_bytes: int,
                 measure: Callable[[list[dict]], int]) -> None: ...
    def rows(self, terms: list[bytes], scalars: list[bytes] | None, marker: bytes | None,
             array_markers: list[bytes], limit: int | None, offset: int, copy: bool,
             max_rows: int | None, charge: list[int] | None) -> tuple[int, list[dict] | None]: ...
