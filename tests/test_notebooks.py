"""Every notebook runs top to bottom, and every cell that plots shows its plot.

A notebook can run without error and still show nothing: ``matplotlib.use("Agg")`` in a
cell turned the inline backend off, and the plot went nowhere. So each notebook is executed
here (nbclient, in a real kernel, in an empty working directory) and each code cell that
calls a plotting function must have an ``image/png`` among its outputs. A notebook that
reads ``KAFKA_BOOTSTRAP`` runs against the tests' own Kafka broker (the ``kafka`` fixture,
started only for such notebooks, and skipped where it cannot run); the kernel inherits the
variable from this process.
"""

from __future__ import annotations

import pathlib
import re

import nbformat
import pytest
from nbclient import NotebookClient

NOTEBOOKS = sorted((pathlib.Path(__file__).resolve().parents[1] / "notebooks").glob("*.ipynb"))
PLOTS = re.compile(r"\bplt\.|\.plot\(|\bax\.")  # a cell that draws something
CELL_TIMEOUT = 600  # seconds; the slowest cell ingests 200,000 rows on a 2-core machine


def plotting_cells(nb) -> list[tuple[int, object]]:
    return [(i, c) for i, c in enumerate(nb.cells) if c.cell_type == "code" and PLOTS.search(c.source)]


def shows_an_image(cell) -> bool:
    return any("image/png" in out.get("data", {}) for out in cell.outputs)


def needs_kafka(nb) -> bool:
    """The notebook connects to a Kafka broker at $KAFKA_BOOTSTRAP."""
    return any("KAFKA_BOOTSTRAP" in c.source for c in nb.cells)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_runs_and_shows_its_plots(path, tmp_path, request, monkeypatch):
    nb = nbformat.read(path, as_version=4)
    assert plotting_cells(nb), f"{path.name} has no plot: is the PLOTS pattern still right?"
    if needs_kafka(nb):
        pytest.importorskip("confluent_kafka")
        monkeypatch.setenv("KAFKA_BOOTSTRAP", request.getfixturevalue("kafka").bootstrap)
    NotebookClient(nb, timeout=CELL_TIMEOUT, kernel_name="python3",
                   resources={"metadata": {"path": str(tmp_path)}}).execute()
    blank = [i for i, cell in plotting_cells(nb) if not shows_an_image(cell)]
    assert not blank, f"{path.name}: code cells {blank} plot but show no image (inline backend off?)"


def test_a_plot_sent_to_agg_is_caught(tmp_path):
    """The check itself: the old notebook's Agg switch leaves the plotting cell blank."""
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(
        'import matplotlib\nmatplotlib.use("Agg")\nimport matplotlib.pyplot as plt\nplt.plot([1, 2])')])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    NotebookClient(nb, timeout=120, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}).execute()
    assert [i for i, _ in plotting_cells(nb)] == [0]
    assert not shows_an_image(nb.cells[0])
