"""Type stub of the compiled point lookup (twin of rtindex._py.point)."""

from typing import Callable

class PointLookup:
    """One snapshot's views, laid out for point queries (see ``rtindex._py.point``)."""

    def __init__(self, views: list[tuple], fetchers: list[Callable[[list[int], list[int] | None], list[dict]]]) -> None: ...
    def rows(self, terms: list[bytes], scalars: list[bytes] | None, marker: bytes | None,
             array_markers: list[bytes], limit: int | None, offset: int, copy: bool,
             max_rows: int | None, charge: list[int] | None) -> tuple[int, list[dict] | None]: ...
