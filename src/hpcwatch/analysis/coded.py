"""A text column as integer codes: what the analyses' numpy works on instead of a Python object per row.

A 1,536-GPU job's report holds 200,000 DCGM rows a minute of its life, with a handful of distinct hosts, GPUs,
jobs and label sets among them. Turned into Python strings row by row, each column cost more than all the
arithmetic done with it; as Arrow's dictionary codes, a column is one C pass and its distinct values a short
list. ``Coded.of`` takes a pyarrow column (plain text, or already dictionary-encoded as the store's label
sets come from ``store.queries``), ``Coded.of_values`` a sequence of Python values.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

__all__ = ["Coded", "joint_codes", "as_text"]


@dataclass(frozen=True, slots=True)
class Coded:
    """Each row's code (-1: null) into ``names``, the column's distinct values."""

    codes: np.ndarray
    names: list[Any]

    @classmethod
    def of(cls, column: pa.ChunkedArray | pa.Array) -> Coded:
        """By Arrow's dictionary encoding; a column already encoded keeps its dictionary (its chunks' are
        unified, which remaps codes, not text)."""
        chunked = column if isinstance(column, pa.ChunkedArray) else pa.chunked_array([column])
        if pa.types.is_dictionary(chunked.type):
            encoded = chunked.unify_dictionaries()
        else:
            encoded = chunked.dictionary_encode()
        if not encoded.num_chunks:
            return cls(np.zeros(0, dtype=np.int64), [])
        # Every chunk of one encoding indexes the same dictionary (the last chunk's holds them all).
        codes = [c.indices.fill_null(-1).to_numpy(zero_copy_only=False) for c in encoded.chunks]
        return cls(np.concatenate(codes).astype(np.int64, copy=False), encoded.chunks[-1].dictionary.to_pylist())

    @classmethod
    def of_values(cls, values: Iterable[Any]) -> Coded:
        """From Python values (None: null), in order of first appearance."""
        index: dict[Any, int] = {}
        codes = [-1 if v is None else index.setdefault(v, len(index)) for v in values]
        return cls(np.array(codes, dtype=np.int64), list(index))

    def __len__(self) -> int:
        return len(self.codes)

    def code(self, name: Any) -> int:
        """The code of ``name``; -2, which no row has, when no row holds it."""
        try:
            return self.names.index(name)
        except ValueError:
            return -2

    def take(self, rows: np.ndarray) -> Coded:
        return Coded(self.codes[rows], self.names)

    def values(self) -> np.ndarray:
        """Each row's value as a Python object (None where null): for the few paths that need them."""
        values: np.ndarray = self.table()[self.codes]
        return values

    def table(self) -> np.ndarray:
        """``names`` as an object array with a None after them: indexing it by codes gives the values."""
        table = np.empty(len(self.names) + 1, dtype=object)
        table[: len(self.names)] = self.names
        table[-1] = None
        return table

    def ranks(self) -> np.ndarray:
        """An integer key per row that sorts as the rows' values written as text (a null as "None") sort."""
        _, rank = np.unique(np.array([*map(str, self.names), "None"], dtype=str), return_inverse=True)
        ranks: np.ndarray = rank.reshape(-1)[self.codes]
        return ranks

    def per_name(self, fn: Any) -> Sequence[Any]:
        """``fn`` of each distinct value, then of None (a null row's): index it by ``codes``."""
        return [fn(name) for name in self.names] + [fn(None)]


def joint_codes(*columns: Coded) -> tuple[np.ndarray, list[tuple[Any, ...]]]:
    """A code per row for the tuple of its values in several columns (codes from 0, in the order of the
    tuples' codes), and each code's tuple (a null as None)."""
    joint = np.zeros(len(columns[0]), dtype=np.int64)
    for column in columns:
        joint = joint * (len(column.names) + 1) + (column.codes + 1)  # a null's -1 becomes 0
    distinct, codes = np.unique(joint, return_inverse=True)
    parts = []
    for column in reversed(columns):  # each column's value of every distinct tuple, by array (a port a tuple)
        distinct, at = np.divmod(distinct, len(column.names) + 1)
        parts.append(np.concatenate([[None], column.table()[:-1]])[at].tolist())
    return codes.reshape(-1).astype(np.int64, copy=False), list(zip(*reversed(parts)))


def as_text(column: pa.ChunkedArray) -> pa.ChunkedArray:
    """A text column as text, decoded when it came dictionary-encoded (the label sets of
    ``store.queries.window_samples`` and ``job_window_samples``): for what compares or joins the text itself."""
    return column.cast(pa.string()) if pa.types.is_dictionary(column.type) else column
