"""Columnar tables: the storage form of every per-event or per-rank table.

A table is a set of equally long numpy columns. Text columns are stored as
``int32`` codes into a per-column list of strings (``-1`` means missing), which
keeps 100k-event traces small in memory and lets them be saved with
``np.savez`` and loaded with ``allow_pickle=False`` (no code runs on load).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass
class Table:
    """Equal-length numpy columns; ``categories[col]`` decodes a text column."""

    columns: dict[str, np.ndarray] = field(default_factory=dict)
    categories: dict[str, list[str]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        lengths = {name: len(col) for name, col in self.columns.items()}
        if len(set(lengths.values())) > 1:
            raise ValueError(f"table columns differ in length: {lengths}")
        for name in self.categories:
            if name not in self.columns:
                raise ValueError(f"categories given for missing column {name!r}")

    def __len__(self) -> int:
        for col in self.columns.values():
            return len(col)
        return 0

    def __contains__(self, name: str) -> bool:
        return name in self.columns

    def __getitem__(self, name: str) -> np.ndarray:
        return self.columns[name]

    def text(self, name: str) -> np.ndarray:
        """The column decoded to Python strings (missing values become "")."""
        codes = self.columns[name]
        labels = np.asarray(list(self.categories[name]) + [""], dtype=object)
        return labels[np.where(codes < 0, len(labels) - 1, codes)]

    def select(self, mask_or_index: np.ndarray) -> Table:
        """Rows picked by a boolean mask or an index array; categories shared."""
        return Table(
            {k: v[mask_or_index] for k, v in self.columns.items()},
            dict(self.categories),
        )

    def to_pandas(self) -> Any:
        """A pandas DataFrame with text columns decoded (for users' own analysis)."""
        import pandas as pd

        data = {
            k: (self.text(k) if k in self.categories else v)
            for k, v in self.columns.items()
        }
        return pd.DataFrame(data)

    @classmethod
    def from_records(
        cls, rows: Iterable[Mapping[str, Any]], text: Iterable[str] = ()
    ) -> Table:
        """Build a small table from dict rows; ``text`` names the string columns."""
        rows = list(rows)
        text = set(text)
        names: list[str] = []
        for row in rows:
            for key in row:
                if key not in names:
                    names.append(key)
        columns: dict[str, np.ndarray] = {}
        categories: dict[str, list[str]] = {}
        for name in names:
            values = [row.get(name) for row in rows]
            if name in text:
                codes, labels = encode_text(values)
                columns[name], categories[name] = codes, labels
            else:
                columns[name] = np.asarray(
                    [np.nan if v is None else v for v in values]
                )
        return cls(columns, categories)


def encode_text(values: Iterable[str | None]) -> tuple[np.ndarray, list[str]]:
    """Intern strings: (int32 codes, labels); ``None`` becomes -1."""
    index: dict[str, int] = {}
    codes = []
    for v in values:
        if v is None:
            codes.append(-1)
        else:
            codes.append(index.setdefault(v, len(index)))
    return np.asarray(codes, dtype=np.int32), list(index)
