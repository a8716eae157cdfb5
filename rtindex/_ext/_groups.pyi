"""Type stub of the compiled group numbering (twin of rtindex._py.groups)."""

import numpy as np

def factorize(values: np.ndarray, valid: np.ndarray | None = None) -> tuple[np.ndarray, int, np.ndarray]:
    """(each row's group, the number of groups, each group's first row): see ``rtindex._py.groups``."""
