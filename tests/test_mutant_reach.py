"""tests/mutants/reach.py: which graded cells a changed TODO cell can reach, on a small notebook of three TODOs."""

from __future__ import annotations

import nbformat

from tests.mutants.reach import cells_reached

SOLUTIONS = {
    "first": "import math\nimport torch\n\n\ndef first(x):\n    return math.floor(x)\n",
    "second": "import torch\n\n\ndef _helper(x):\n    return x + 1\n\n\ndef second(x):\n    return _helper(x)\n",
    "third": "def third(x):\n    return torch.tensor(math.ceil(x))\n",  # reads the names the first cell imported
}
TESTS = {
    "test_first": "assert first(1.5) == 1",
    "test_first__edge": "assert first(0.0) == 0",
    "test_second": "assert second(1) == 2",
    "test_third": "assert third(1.5) == 2",
    "test_second__with_first": "assert second(first(1.5)) == 2",
}


def _notebook():
    made = []
    for name, source in SOLUTIONS.items():
        meta = {"nbgrader": {"solution": True, "grade": False, "grade_id": f"todo_{name}"}}
        made.append(nbformat.v4.new_code_cell(source, metadata=meta))
    for grade_id, source in TESTS.items():
        meta = {"nbgrader": {"solution": False, "grade": True, "grade_id": grade_id, "points": 1}}
        made.append(nbformat.v4.new_code_cell(source, metadata=meta))
    return nbformat.v4.new_notebook(cells=made)


def test_a_changed_body_reaches_its_own_cells_and_those_that_call_it():
    wrong = "import math\nimport torch\n\n\ndef first(x):\n    return math.ceil(x)\n"
    assert cells_reached(_notebook(), "first", wrong) == {"test_first", "test_first__edge", "test_second__with_first"}
    wrong = "import torch\n\n\ndef _helper(x):\n    return x + 2\n\n\ndef second(x):\n    return _helper(x)\n"
    assert cells_reached(_notebook(), "second", wrong) == {"test_second", "test_second__with_first"}


def test_imports_written_differently_or_bound_by_another_cell_change_nothing():
    same = "from torch import tensor\nimport math as math\nimport torch\n\n\ndef first(x):\n    return math.floor(x)\n"
    assert cells_reached(_notebook(), "first", same) == {"test_first", "test_first__edge"}  # always its own
    without_torch = "import math\n\n\ndef first(x):\n    return math.floor(x)\n"  # the second cell imports it too
    assert "test_third" not in cells_reached(_notebook(), "first", without_torch)


def test_every_cell_when_another_solution_reads_what_changed():
    without_math = "import torch\n\n\ndef first(x):\n    return int(x // 1)\n"  # the third cell's `math` is gone
    assert cells_reached(_notebook(), "first", without_math) is None
    shadowing = "import torch\n\n\ndef _helper(x):\n    return 0\n\n\ndef third(x):\n    return torch.tensor(2)\n"
    assert cells_reached(_notebook(), "third", shadowing) is None  # the second TODO's helper, replaced


def test_statements_the_checker_drops_change_nothing():
    dropped = SOLUTIONS["second"] + "print('hello')\nsecond.__code__ = (lambda x: 0).__code__\n"
    assert cells_reached(_notebook(), "second", dropped) == {"test_second", "test_second__with_first"}  # its own


def test_every_cell_when_the_cell_does_more_than_bind_names():
    for source in (
        "import functools\n\n\n@functools.cache\ndef second(x):\n    return x + 1\n",
        "from . import second\n",
        "def second(x):\n    return (\n",
        "import torch\n_ = torch.set_default_dtype(torch.float64)\n\n\ndef second(x):\n    return x + 1\n",
    ):
        assert cells_reached(_notebook(), "second", source) is None, source


def test_a_lambda_bound_but_not_called_does_nothing():
    """A lambda's body runs when it is called, not when it is bound; its defaults run at once."""
    later = "import torch\n_as_tensor = lambda x: torch.tensor(x)\n\n\ndef second(x):\n    return x + 1\n"
    assert cells_reached(_notebook(), "second", later) == {"test_second", "test_second__with_first"}
    now = later.replace("lambda x: torch.tensor(x)", "lambda x=torch.set_default_dtype(torch.float64): x")
    assert now != later and cells_reached(_notebook(), "second", now) is None
