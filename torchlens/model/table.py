"""Columnar tables: the storage form of every per-event or per-rank table.

A table is a set of equally long numpy columns. Text columns are stored as
``int32`` codes into a per-column list of strings (``-1`` means missing), which
keeps 100k-event traces small in memory and lets them be saved with
``np.savez`` and loaded with ``allow_pickle=False`` (no code runs on load).

A column that is one value in most rows (a trace's collective sizes, memory
addresses, FLOPs: set on a few events of millions) may be held ``Sparse``:
the rows that differ and their values. Reading it (``table[name]``,
``table.columns[name]``, ``.items()``) gives the whole numpy column, made for
that read, so no caller sees the difference; the table holds a few MB where
the dense column held 8 bytes a row.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass(frozen=True)
class Sparse:
    """A column of ``n`` rows of ``dtype``, ``fill`` but at ``rows`` (their ``values``)."""

    n: int
    fill: Any
    dtype: Any
    rows: np.ndarray
    values: np.ndarray

    #: a column is held sparse when at most this share of its rows differ from its fill
    SHARE = 0.125

    def __len__(self) -> int:
        return self.n

    def at(self, row: int) -> Any:
        """One row's value, without making the column whole."""
        i = int(np.searchsorted(self.rows, row))
        if i < len(self.rows) and int(self.rows[i]) == row:
            return self.values[i]
        return self.dtype.type(self.fill)

    def dense(self) -> np.ndarray:
        out = np.full(self.n, self.fill, self.dtype)
        out[self.rows] = self.values
        return out

    @classmethod
    def of(cls, column: np.ndarray, fill: Any) -> Sparse | None:
        """``column`` held sparse, or None when too many rows differ from ``fill``."""
        differ = ~np.isnan(column) if isinstance(fill, float) and np.isnan(fill) \
            else column != fill
        rows = np.flatnonzero(differ)
        if len(rows) > cls.SHARE * len(column):
            return None
        index = rows.astype(np.int32) if len(column) < 2**31 else rows
        return cls(len(column), fill, column.dtype, index, column[rows])

    @classmethod
    def join(cls, parts: list[Sparse]) -> Sparse:
        """The parts one after another (same fill and dtype)."""
        offsets = np.cumsum([0] + [p.n for p in parts[:-1]])
        n = sum(p.n for p in parts)
        rows = np.concatenate([p.rows.astype(np.int64) + o for p, o in zip(parts, offsets,
                                                                          strict=True)])
        return cls(n, parts[0].fill, parts[0].dtype,
                   rows.astype(np.int32) if n < 2**31 else rows,
                   np.concatenate([p.values for p in parts]))


class Columns(dict):
    """A table's columns by name: a ``Sparse`` one is read as its whole column."""

    def __getitem__(self, name: str) -> np.ndarray:
        col = dict.__getitem__(self, name)
        return col.dense() if isinstance(col, Sparse) else col

    def get(self, name: str, default: Any = None) -> Any:
        return self[name] if name in self else default

    def values(self) -> Any:  # type: ignore[override]
        return [self[k] for k in self]

    def items(self) -> Any:  # type: ignore[override]
        return [(k, self[k]) for k in self]

    def held(self, name: str) -> np.ndarray | Sparse:
        """The column as it is held (a ``Sparse`` one not made whole)."""
        return dict.__getitem__(self, name)

    def nbytes(self) -> int:
        """The bytes the columns hold."""
        total = 0
        for k in self:
            col = self.held(k)
            total += (col.rows.nbytes + col.values.nbytes) if isinstance(col, Sparse) \
                else col.nbytes
        return total


@dataclass
class Table:
    """Equal-length numpy columns; ``categories[col]`` decodes a text column."""

    columns: dict[str, np.ndarray] = field(default_factory=dict)
    categories: dict[str, list[str]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.columns, Columns):
            self.columns = Columns(self.columns)
        lengths = {name: len(self.columns.held(name)) for name in self.columns}
        if len(set(lengths.values())) > 1:
            raise ValueError(f"table columns differ in length: {lengths}")
        for name in self.categories:
            if name not in self.columns:
                raise ValueError(f"categories given for missing column {name!r}")

    def __len__(self) -> int:
        for name in self.columns:
            return len(self.columns.held(name))
        return 0

    def __contains__(self, name: str) -> bool:
        return name in self.columns

    def __getitem__(self, name: str) -> np.ndarray:
        return self.columns[name]

    def at(self, name: str, row: int) -> Any:
        """One row's value of a column: for a loop over a few rows, which must
        not make a sparse column whole at each read."""
        col = self.columns.held(name)
        return col.at(row) if isinstance(col, Sparse) else col[row]

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
