"""The tables a trial's analysis writes, analysis/<kind>.parquet: the parts of each kind (one
per generator or link) gathered and written once whole, addresses as dotted-quad categoricals;
or, for the queue's events (millions of rows), written piece by piece as they are merged, each
piece a row group. Read back, a table written in pieces is the one written at once (the same
columns, values and categories: parquet readers join the pieces' dictionaries in order)."""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import numpy as np

from analysis.lazy import pd
from analysis.pcap import addresses_as_strings

__all__ = ["Tables"]


class Tables:
    """Tables of one trial's analysis, written into ``out_dir``."""

    def __init__(self, out_dir: Path) -> None:
        self.out_dir = out_dir
        self.parts: dict[str, list[pd.DataFrame]] = {}
        self.writers: dict[str, tuple] = {}
        self.writing: Future | None = None  # the piece being written (by its own thread)
        self.pool = ThreadPoolExecutor(1, thread_name_prefix="parquet")

    def add(self, kind: str, frame: pd.DataFrame, addresses: int | None = None) -> None:
        """A part of table ``kind``, written by write() after the parts added before; or at
        once (a part at a time: not held), where the caller knows at most how many
        ``addresses`` (src, dst) the whole table has (few: their codes take a byte, whatever
        the number) and that all its parts have the columns and types of this one."""
        if addresses is None or _codes(addresses) != _codes(1) or kind in self.parts:
            self.parts.setdefault(kind, []).append(frame)
            return
        counts = {c: addresses for c in ("src", "dst") if c in frame.columns}
        self.stream(kind, addresses_as_strings(frame), counts)

    def stream(self, kind: str, piece, categories: dict[str, int]) -> None:
        """The next rows of table ``kind`` (a frame, its addresses already categorical:
        analysis.pcap.ip_strings; or the pyarrow table of such a frame), written now by the
        writer's thread while the caller goes on (one piece at a time: the one before is
        written first). ``categories``: how many each categorical column has in the whole
        table (its codes are stored in the type pandas gives that many)."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        table = (
            piece
            if isinstance(piece, pa.Table)
            else pa.Table.from_pandas(piece, preserve_index=False)
        )
        if kind not in self.writers:
            codes = {name: pa.from_numpy_dtype(_codes(n)) for name, n in categories.items()}
            schema = pa.schema(
                [
                    f.with_type(pa.dictionary(codes[f.name], f.type.value_type))
                    if pa.types.is_dictionary(f.type)
                    else f
                    for f in table.schema
                ],
                metadata=table.schema.metadata,
            )
            path = self.out_dir / f"{kind}.parquet"
            dictionaries = _dictionaries(schema)
            writer = pq.ParquetWriter(
                path,
                schema,
                compression="snappy",
                use_dictionary=dictionaries,
                # min/max of the numbers only (what a reader's filter on time or size
                # skips row groups by): the text columns' took a fifth of the writing
                write_statistics=[f.name for f in schema if f.name not in dictionaries],
            )
            self.writers[kind] = (writer, schema)
        writer, schema = self.writers[kind]
        self._wait()
        self.writing = self.pool.submit(writer.write_table, table.cast(schema))

    def _wait(self) -> None:
        """The piece being written, written (its error raised here)."""
        if self.writing is not None:
            writing, self.writing = self.writing, None
            writing.result()

    def write(self) -> None:
        """Every table gathered whole, each kind's parts one after the other (written a part
        at a time where they have the same columns and types: no concatenation of them all
        in memory); the streamed ones closed."""
        self._end_streams()
        while self.parts:  # each kind's parts go once its table is written
            kind, parts = self.parts.popitem()
            if len(parts) > 1 and _alike(parts):
                categories = {
                    c: len(np.unique(np.concatenate([p[c].unique() for p in parts])))
                    for c in ("src", "dst")
                    if c in parts[0].columns
                }
                for part in parts:
                    self.stream(kind, addresses_as_strings(part), categories)
                self._end_streams()
                continue
            table = addresses_as_strings(pd.concat(parts, ignore_index=True))
            del parts
            table.to_parquet(self.out_dir / f"{kind}.parquet", index=False)

    def _end_streams(self) -> None:
        """The streamed tables closed (the pieces given written first)."""
        try:
            self._wait()
        finally:
            for writer, _ in self.writers.values():
                writer.close()
            self.writers.clear()

    def close(self) -> None:
        """Streams closed, the writer's thread ended (also after a failure)."""
        try:
            self._end_streams()
        finally:
            self.pool.shutdown()


def _dictionaries(schema) -> list[str]:
    """The columns a piece-by-piece table stores dictionary-encoded: the categorical and the
    text ones (the numbers' dictionaries, tried and dropped piece after piece, took a tenth
    of the writing)."""
    import pyarrow as pa

    return [
        f.name
        for f in schema
        if pa.types.is_dictionary(f.type)
        or pa.types.is_large_string(f.type)
        or pa.types.is_string(f.type)
    ]


def _alike(parts: list[pd.DataFrame]) -> bool:
    """Whether the parts have the same columns of the same types and no categorical one
    (concatenated, their columns keep their types: written one by one, the same table)."""
    first = parts[0].dtypes
    if any(isinstance(t, pd.CategoricalDtype) for t in first):
        return False
    return all(p.dtypes.equals(first) for p in parts[1:])


def _codes(categories: int):
    """The type of a categorical's codes with this many categories (as pandas picks it)."""
    return pd.Categorical.from_codes([], categories=range(categories)).codes.dtype
