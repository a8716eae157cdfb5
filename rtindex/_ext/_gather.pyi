"""Type stub of the compiled gather of column values (twin of rtindex._py.gather)."""

def gather(kind: int, parts: list[tuple]) -> tuple[int, bytes | None, bytes, bytes | None]:
    """The buffers of one Arrow array holding every part's values (see ``rtindex._py.gather``)."""
