"""A records frame's rows as dicts, built column by column: what ``DataFrame.to_dict("records")``
gives (of the frame with missing cells as None, ``none_for_missing``), without boxing each cell
through pandas (a large store's frames have hundreds of thousands of cells)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pandas as pd


def row_dicts(df: "pd.DataFrame", none_for_missing: bool = False) -> list[dict]:
    """Each row of ``df`` as a dict of its columns' Python values (``to_dict("records")``'s);
    ``none_for_missing``: a missing cell (NaN, NaT, NA) as None, as in
    ``df.astype(object).where(df.notna(), None)``."""
    names = list(df.columns)
    if len(set(names)) != len(names):
        raise ValueError("row_dicts: the frame's column names repeat")
    columns = []
    for i in range(len(names)):
        col = df.iloc[:, i]
        if none_for_missing:
            col = col.astype(object).where(col.notna(), None)
        columns.append(col.tolist())
    return [dict(zip(names, row)) for row in zip(*columns)] if names else [{} for _ in range(len(df))]
