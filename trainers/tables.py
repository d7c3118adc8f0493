"""Tables where they live: ``--data`` as a CSV or Parquet file, a folder of them or a glob, on a local path or any
fsspec URL (``s3://``, ``gs://``, ``file://``; credentials from fsspec's usual environment).

A table is found from its files' listing alone (``find``): its parts, their sizes and ETags or modification times,
whose digest is the job's lineage (a resume compares it). Its columns are checked from each part's schema (a Parquet
footer, a CSV header), not from its rows. Rows read in parts are split by a seeded hash of their part's name and
row number (``validation_rows``): the same rows are validation rows whoever reads them, with no shuffle.
"""

from __future__ import annotations

import csv
import hashlib
import io
import os
import zipfile
from dataclasses import dataclass
from typing import Any

import fsspec
import numpy as np
import pyarrow.parquet as pq

from prefect_hyperband.common.errors import InputError, first_line

#: a part's format by the end of its name (compressed CSV as pandas reads it)
_CSV_ENDS = (".csv", ".csv.gz", ".csv.bz2", ".csv.zip", ".csv.xz", ".csv.zst")
_PARQUET_ENDS = (".parquet", ".pq")


#: the data sets bundled with the package (``--data`` names them), not tables read in parts
BUILTIN = ("bank-marketing", "digits", "breast-cancer")


def file_format(name: str) -> str | None:
    """``csv``, ``parquet`` or None, from a file's name."""
    lower = name.lower()
    if lower.endswith(_PARQUET_ENDS):
        return "parquet"
    if lower.endswith(_CSV_ENDS):
        return "csv"
    return None


def in_parts(data: str) -> bool:
    """``data`` is read here: a URL, a folder, a glob or a Parquet file. A local CSV file is read whole as before
    (its split unchanged), and a bundled data set by its name."""
    if "://" in data or any(c in data for c in "*?[") or file_format(data) == "parquet":
        return True
    return os.path.isdir(data)


@dataclass(frozen=True)
class Part:
    """One file of a table: its path on the table's filesystem, size in bytes and stamp (ETag, else modified)."""

    path: str
    size: int
    stamp: str


@dataclass(frozen=True)
class Table:
    """A table's files, found by listing them (no row read)."""

    url: str
    format: str
    parts: tuple[Part, ...]
    root: str  # the folder the parts' names are relative to

    @property
    def digest(self) -> str:
        """The lineage digest: the format and each part's name, size and stamp (16 hex digits)."""
        h = hashlib.sha256(self.format.encode())
        for p in self.parts:
            h.update(f"\0{self.name(p)}\0{p.size}\0{p.stamp}".encode())
        return h.hexdigest()[:16]

    @property
    def size(self) -> int:
        return sum(p.size for p in self.parts)

    def name(self, part: Part) -> str:
        """The part's name relative to the table's folder: what its rows' keys hash."""
        return part.path[len(self.root):].lstrip("/") if part.path.startswith(self.root) else part.path

    def filesystem(self) -> Any:
        return fsspec.core.url_to_fs(self.url)[0]

    def lineage(self) -> dict[str, Any]:
        """What a job records of its data: the URL, the format, the parts' count, bytes and digest."""
        return {"url": self.url, "format": self.format, "parts": len(self.parts), "bytes": self.size,
                "digest": self.digest}


def lineage_of(data: str) -> dict[str, Any] | None:
    """``Table.lineage`` of the data ``data`` names; None for a bundled data set (``BUILTIN``)."""

    return None if data in BUILTIN else find(data).lineage()


def find(data: str) -> Table:
    """The table ``data`` names; ``InputError`` in one line for nothing found, mixed formats or storage refused."""
    url = data if "://" in data else _absolute(data)
    try:
        fs, path = fsspec.core.url_to_fs(url)
        if any(c in path for c in "*?["):
            found = [p for p in fs.glob(path) if fs.isfile(p)]
            root = path[: min(path.find(c) for c in "*?[" if c in path)].rsplit("/", 1)[0]
            nothing = f"data {data!r}: no CSV or Parquet file matches it"
        elif fs.isdir(path):
            found, root = [p for p in fs.find(path) if not _hidden(p[len(path):])], path
            nothing = f"data {data!r}: no CSV or Parquet file in that folder"
        elif fs.isfile(path):
            found, root = [path], path.rsplit("/", 1)[0]
            nothing = f"data {data!r}: not a CSV or Parquet file by its name (.csv, .csv.gz, .parquet)"
        else:
            raise InputError(f"data {data!r} not found; give a CSV or Parquet file, a folder or a glob of them (local "
                             "or a URL such as s3://bucket/table/), or one of bank-marketing, digits, breast-cancer")
        formats = {p: file_format(p) for p in sorted(found)}
        parts = [p for p, f in formats.items() if f]
        if not parts:
            raise InputError(nothing)
        kinds = sorted({formats[p] for p in parts})
        if len(kinds) > 1:
            one = {k: next(p for p in parts if formats[p] == k) for k in kinds}
            raise InputError(f"data {data!r} mixes CSV and Parquet files ({one['csv']}, {one['parquet']}); give one "
                             "format")
        infos = [fs.info(p) for p in parts]
    except InputError:
        raise
    except Exception as exc:  # noqa: BLE001  (storage refused: credentials, a bucket that is not there, a network)
        raise InputError(f"data {data!r}: cannot list it: {type(exc).__name__}: {first_line(exc)}") from None
    return Table(url=url, format=kinds[0], root=root.rstrip("/"),
                 parts=tuple(Part(p, int(i.get("size") or 0), _stamp(i)) for p, i in zip(parts, infos)))


def _absolute(path: str) -> str:
    return os.path.abspath(os.path.expanduser(path))


def _hidden(relative: str) -> bool:
    """Spark's and Hive's bookkeeping files (``_SUCCESS``, ``.part.crc``): not parts of the table."""
    return any(piece.startswith(("_", ".")) for piece in relative.strip("/").split("/"))


def _stamp(info: dict[str, Any]) -> str:
    for key in ("ETag", "etag", "md5Hash", "mtime", "LastModified", "last_modified", "updated", "created"):
        if info.get(key) is not None:
            return str(info[key]).strip('"')
    return ""


def schema(table: Table) -> list[str]:
    """The table's columns, from every part's schema (Parquet's footer, a CSV's header line); a part whose columns
    differ from the first's is an ``InputError`` naming it."""
    fs = table.filesystem()
    first: list[str] | None = None
    for part in table.parts:
        try:
            names = _columns(fs, part.path, table.format)
        except Exception as exc:  # noqa: BLE001  (an unreadable object or file: named in one line)
            raise InputError(f"cannot read {part_url(table, part)}: {type(exc).__name__}: {first_line(exc)}") from None
        if first is None:
            first = names
        elif names != first:
            missing, extra = [c for c in first if c not in names], [c for c in names if c not in first]
            how = "; ".join(x for x in (f"missing {', '.join(missing)}" if missing else "",
                                        f"extra {', '.join(extra)}" if extra else "") if x) or "in another order"
            raise InputError(f"{part_url(table, part)}: its columns differ from {part_url(table, table.parts[0])}'s ({how}); "
                             "every part of a table needs the same columns")
    return first or []


def part_url(table: Table, part: Part) -> str:
    if "://" not in table.url:
        return part.path
    return f"{table.url.split('://', 1)[0]}://{part.path}"


def _columns(fs: Any, path: str, kind: str) -> list[str]:
    if kind == "parquet":
        with fs.open(path, "rb") as fh:
            return list(pq.read_schema(fh).names)
    return list(read_part_csv(fs, path, nrows=0).columns)


def read_part_csv(fs: Any, path: str, nrows: int | None = None) -> Any:
    """A CSV part, comma or semicolon separated (from its first line), compressed as its name says."""
    import pandas as pd

    compression = {"gz": "gzip", "bz2": "bz2", "zip": "zip", "xz": "xz", "zst": "zstd"}.get(path.rsplit(".", 1)[-1])
    with fs.open(path, "rb", compression=None if compression in (None, "zip") else compression) as fh:
        raw = fh.read() if nrows is None else fh.read(64 * 1024)
    if compression == "zip":
        with zipfile.ZipFile(io.BytesIO(raw)) as z:
            raw = z.read(z.namelist()[0])
    head = raw[: 64 * 1024].decode("utf-8", errors="replace").splitlines()
    if not head or not head[0].strip():
        raise ValueError("the file is empty")
    try:
        sep = csv.Sniffer().sniff(head[0], delimiters=",;").delimiter
    except csv.Error:
        sep = ","
    if nrows == 0:
        return pd.read_csv(io.StringIO(head[0]), sep=sep)
    return pd.read_csv(io.BytesIO(raw), sep=sep, nrows=nrows)


def read(table: Table) -> tuple[Any, list[tuple[str, int]]]:
    """Every row (one pandas frame, Parquet through Arrow) and, for each part in order, its name and row count."""
    import pandas as pd

    fs = table.filesystem()
    frames, sizes = [], []
    for part in table.parts:
        try:
            if table.format == "parquet":
                with fs.open(part.path, "rb") as fh:
                    frame = pq.read_table(fh).to_pandas()
            else:
                frame = read_part_csv(fs, part.path)
        except Exception as exc:  # noqa: BLE001
            raise InputError(f"cannot read {part_url(table, part)}: {type(exc).__name__}: {first_line(exc)}") from None
        frames.append(frame)
        sizes.append((table.name(part), len(frame)))
    return pd.concat(frames, ignore_index=True) if len(frames) > 1 else frames[0], sizes


def validation_rows(sizes: list[tuple[str, int]], seed: int, fraction: float) -> np.ndarray:
    """Which rows are validation rows: a seeded hash (SplitMix64) of each row's part name and row number below
    ``fraction``. Whoever reads a part (one process, any Dask worker, a resume) marks the same rows."""
    out = []
    with np.errstate(over="ignore"):
        for name, n in sizes:
            base = np.uint64(int.from_bytes(hashlib.sha256(f"{seed}\0{name}".encode()).digest()[:8], "little"))
            z = np.arange(n, dtype=np.uint64) + base + np.uint64(0x9E3779B97F4A7C15)
            z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
            z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
            z ^= z >> np.uint64(31)
            out.append((z >> np.uint64(11)).astype(np.float64) / float(2**53) < fraction)
    return np.concatenate(out) if out else np.zeros(0, dtype=bool)
