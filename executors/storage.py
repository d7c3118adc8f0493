"""Where a job's state and checkpoints live: a local or shared folder, or any fsspec URL.

``--storage s3://bucket/prefix`` (``gs://``, ``az://``... through their fsspec packages) keeps the
job's record, its state and every checkpoint under ``<url>/<job_id>/``, so a trial-rung on one
machine resumes the checkpoint another machine wrote. Trainers only ever see local files: a
checkpoint is fetched into the local job folder (its mirror) before training and published from
there after. On a local or shared path both steps are the identity: the files are used in place.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit

import fsspec

from prefect_hyperband.common.errors import InputError, first_line
from prefect_hyperband.common.files import write_json_atomic

T = TypeVar("T")
#: the suffix of a document's previous version, kept by ``Storage.write_json(keep_previous=True)``
PREVIOUS = ".prev"
#: what reading or building a damaged document raises (JSONDecodeError and UnicodeDecodeError are ValueErrors)
DAMAGE = (ValueError, KeyError, TypeError, IndexError, AttributeError)


def is_local(url: str) -> bool:
    """A plain path or ``file://``: no copies, the files are used where they are."""
    return "://" not in url or url.startswith("file://")


def join(root: str, *parts: str) -> str:
    return "/".join([root.rstrip("/"), *parts])


class Storage:
    """One job's folder or URL (``<storage>/<job_id>``) and a local mirror of it (the job folder)."""

    def __init__(self, root: str, mirror: str) -> None:
        self.root = root.rstrip("/")
        self.mirror = mirror
        self.local = is_local(root)
        if self.local:
            self.fs = None
            self.path = str(Path(root.removeprefix("file://")).resolve())
        else:
            self.fs = filesystem(root)

    def url(self, key: str) -> str:
        return os.path.join(self.path, key) if self.local else join(self.root, key)

    def read_json(self, key: str) -> Any | None:
        """The JSON document at ``key``, or None when there is none."""
        if self.local:
            path = Path(self.url(key))
            return json.loads(path.read_text()) if path.is_file() else None
        try:
            return json.loads(self.fs.cat_file(self.url(key)))
        except FileNotFoundError:
            return None

    def write_json(self, key: str, value: Any, indent: int | None = 2, keep_previous: bool = False) -> None:
        """Atomic on a folder (a temporary file renamed); one PUT on an object store. ``keep_previous``: the
        document it replaces stays as ``<key>.prev`` (a hard link on a folder, a server-side copy on an object
        store), so one bad write (a full disk, a copy cut short, a hand edit) still leaves a good one."""
        if keep_previous:
            self._keep(key)
        if self.local:
            write_json_atomic(self.url(key), value, indent=indent)
        else:
            self.fs.pipe_file(self.url(key), json.dumps(value, indent=indent).encode())

    def append(self, key: str, data: bytes) -> None:
        """``data`` at the end of the file ``key`` in one write (a folder only: object stores cannot append)."""
        if not self.local:
            raise ValueError(f"{self.root} is an object store: it cannot append to {key}")
        fd = os.open(self.url(key), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        size = os.fstat(fd).st_size
        try:
            view = memoryview(data)
            while view:  # a short write (a filling disk) writes the rest or raises
                view = view[os.write(fd, view):]
        except BaseException:
            os.ftruncate(fd, size)  # no part of the record stays to be read as one (a full disk, a signal)
            raise
        finally:
            os.close(fd)

    def write_bytes(self, key: str, data: bytes, keep_previous: bool = False) -> None:
        """One file or object, whole (atomic on a folder); ``keep_previous`` as ``write_json``'s."""
        if keep_previous:
            self._keep(key)
        if self.local:
            path = Path(self.url(key))
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = f"{path}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
            try:
                Path(tmp).write_bytes(data)
                os.replace(tmp, path)
            except BaseException:
                Path(tmp).unlink(missing_ok=True)  # a full disk: the part written goes, the old file stays whole
                raise
        else:
            self.fs.pipe_file(self.url(key), data)

    def read_bytes(self, key: str) -> bytes | None:
        """The bytes at ``key``, or None when there is none."""
        try:
            if self.local:
                return Path(self.url(key)).read_bytes()
            return self.fs.cat_file(self.url(key))
        except (FileNotFoundError, IsADirectoryError):
            return None

    def keys(self, prefix: str) -> list[str]:
        """The keys of the files or objects whose names start with ``prefix`` (at the job's top level, or under
        the folder ``prefix`` names when it ends in ``/``), sorted."""
        folder, _, start = prefix.rpartition("/")
        if self.local:
            where = Path(self.url(folder)) if folder else Path(self.path)
            if not where.is_dir():
                return []
            names = [p.name for p in where.iterdir() if p.is_file() and p.name.startswith(start)]
        else:
            where = self.url(folder) if folder else self.root
            self.fs.invalidate_cache(where)  # a listing cached by fsspec would miss the objects written since
            try:
                found = self.fs.ls(where, detail=False)
            except FileNotFoundError:
                return []
            names = [f.rstrip("/").rsplit("/", 1)[-1] for f in found]
            names = [n for n in names if n.startswith(start)]
        return sorted(f"{folder}/{n}" if folder else n for n in names)

    def _keep(self, key: str) -> None:
        url, prev = self.url(key), self.url(key + PREVIOUS)
        if self.local:
            # unique per call: a pid alone collides with the link a killed process left (pids are reused)
            tmp = f"{prev}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
            try:
                os.link(url, tmp)
            except FileNotFoundError:
                return
            os.replace(tmp, prev)  # ``key`` is never missing: its old version is linked, then replaced
        else:
            try:
                self.fs.copy(url, prev)
            except FileNotFoundError:
                pass

    def read_kept(self, key: str, build: Callable[[Any], T]) -> tuple[T | None, str | None]:
        """``build`` of the document at ``key``, or of its previous version (``write_json(keep_previous=True)``)
        when ``key`` is damaged (not JSON, or a document ``build`` rejects) or missing: then a damaged ``key`` is
        set aside as ``<key>.damaged``, restored from the previous version, and the notice (one line) says so.
        ``(None, None)`` when neither exists; an ``InputError`` naming the file when nothing good is left."""
        damage: dict[str, str] = {}
        for name in (key, key + PREVIOUS):
            try:
                raw = self.read_json(name)
                if raw is None:
                    continue
                built = build(raw)
            except DAMAGE as exc:  # not JSON, a missing key, a wrong type: all mean damaged
                damage[name] = f"{type(exc).__name__}: {first_line(exc)}"
                continue
            if name == key:
                return built, None
            if key in damage:
                self.move(key, key + ".damaged")
            self.write_json(key, raw, indent=None)  # ``key`` good again: the next write keeps this version
            how = f"damaged ({damage[key]}); the damaged file is kept as {key}.damaged" if key in damage else "missing"
            return built, f"{self.url(key)} is {how}; restored from its previous version {key + PREVIOUS}"
        if not damage:
            return None, None
        first = f"damaged ({damage[key]})" if key in damage else "missing"
        prev = damage.get(key + PREVIOUS)
        raise InputError(f"{self.url(key)} is {first} and "
                         + (f"so is its previous version ({prev})" if prev else "it has no previous version")
                         + "; nothing good is left to resume from: start a new job, or restore the file")

    def move(self, key: str, to: str) -> None:
        if self.local:
            os.replace(self.url(key), self.url(to))
        else:
            self.fs.mv(self.url(key), self.url(to))

    def delete(self, key: str) -> None:
        if self.local:
            Path(self.url(key)).unlink(missing_ok=True)
        else:
            try:
                self.fs.rm_file(self.url(key))
            except FileNotFoundError:
                pass

    def delete_folder(self, key: str) -> None:
        """A folder or an object-store prefix, with everything under it (nothing when it is not there)."""
        if self.local:
            shutil.rmtree(self.url(key), ignore_errors=True)
        else:
            try:
                self.fs.rm(self.url(key), recursive=True)
            except FileNotFoundError:
                pass

    def fetch(self, url: str) -> str:
        """A local path holding ``url``: the URL itself on a folder; else its mirror, downloaded when missing."""
        if self.local or is_local(url):
            return url
        local = os.path.join(self.mirror, self._key(url))
        if not os.path.exists(local):
            Path(local).parent.mkdir(parents=True, exist_ok=True)
            self.fs.get(url, local, recursive=self.fs.isdir(url))
        return local

    def publish(self, local: str) -> str:
        """The URL of a file or folder written under the mirror, uploaded there (replacing what a crashed try left)."""
        if self.local:
            return local
        key = os.path.relpath(local, self.mirror)
        if key.startswith(".."):
            raise ValueError(f"{local} is not under the job's folder {self.mirror}")
        url = join(self.root, *Path(key).parts)
        if os.path.isdir(local):
            if self.fs.exists(url):
                self.fs.rm(url, recursive=True)
            self.fs.put(local, url, recursive=True)
        else:
            self.fs.put_file(local, url)
        return url

    def _key(self, url: str) -> str:
        stripped, root = _strip(url), _strip(self.root)
        if not stripped.startswith(root + "/"):
            raise ValueError(f"{url} is not under the job's storage {self.root}")
        return stripped[len(root) + 1:]


def _strip(url: str) -> str:
    return url.split("://", 1)[-1].rstrip("/")


def filesystem(url: str):
    """The fsspec filesystem of ``url`` (an unknown scheme, or one whose package is missing: one line); fsspec keeps
    one instance per filesystem and options itself."""
    protocol = url.split("://", 1)[0]
    try:
        cls = fsspec.get_filesystem_class(protocol)
    except (ValueError, ImportError) as exc:
        extra = {"s3": "s3", "s3a": "s3", "gs": "gcs", "gcs": "gcs"}.get(protocol)
        hint = f" (pip install 'prefect-hyperband[{extra}]')" if extra else ""
        raise InputError(f"--storage {url}: no filesystem for {protocol}://{hint}: {exc}") from exc
    try:  # the host, port and user a URL names (ftp://, sftp://), with S3's endpoint
        return cls(**{**cls._get_kwargs_from_urls(url), **_options(protocol)})
    except Exception as exc:  # noqa: BLE001  (each filesystem raises its own: a host that does not answer, a bad URL)
        raise InputError(f"--storage {url}: cannot open it: {type(exc).__name__}: {first_line(exc)}") from exc


def _options(protocol: str) -> dict[str, Any]:
    """S3-compatible servers (MinIO, moto, Ceph): their endpoint from the standard AWS variable."""
    endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
    if protocol in ("s3", "s3a") and endpoint:
        return {"endpoint_url": endpoint}
    return {}


def check(url: str) -> None:
    """Storage the job can write: one line when it cannot (a missing bucket, no credentials, a read-only folder)."""
    if is_local(url):
        path = Path(url.removeprefix("file://"))
        try:
            path.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise InputError(f"--storage {url}: cannot create the folder: {exc}") from exc
        return
    if not urlsplit(url).netloc:
        raise InputError(f"--storage {url}: names no bucket (e.g. s3://bucket/jobs)")
    if urlsplit(url).scheme == "memory":
        raise InputError(f"--storage {url}: fsspec's memory:// lives in this process only, and --resume could not find "
                         "the job there; give a folder or an object store (s3://bucket/jobs)")
    fs = filesystem(url)
    probe = join(url, ".hyperband-probe")
    try:
        fs.pipe_file(probe, b"ok")
        fs.rm_file(probe)
    except Exception as exc:  # botocore's and gcsfs' errors have no common base: any failure is the user's setup
        said = " ".join(str(exc).split())  # botocore's messages run over several lines
        raise InputError(f"--storage {url}: cannot write there: {type(exc).__name__}: {said[:300]}") from exc
