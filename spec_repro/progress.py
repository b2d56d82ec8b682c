"""Progress bars: ``tqdm`` is tqdm's notebook widget where ipywidgets is installed (``tqdm.auto``), else its
plain text bar. ``tqdm.auto`` alone warns "IProgress not found" (with the path of tqdm's file) in a Jupyter
kernel without ipywidgets, and that warning would land in the notebooks' committed outputs; the plain bar is
what it falls back to there anyway. Import it where a bar is drawn (``from .progress import tqdm``), not at
module level: tqdm is loaded only by the commands that draw one."""
from __future__ import annotations

import importlib.util

if importlib.util.find_spec("ipywidgets") is not None:
    from tqdm.auto import tqdm
else:
    from tqdm import tqdm

__all__ = ["tqdm"]
