"""Files wherever they live: local paths and cloud buckets (gs://, s3:// ...) through one API.

bert_jax reads and writes its workdirs, checkpoints' side files, metrics, logs, vocabularies,
pretrained weights and fine-tuning data through these functions (orbax writes the arrays
itself, through etils `epath`). Remote paths go through one fsspec filesystem per protocol
(gs://: gcsfs, what epath uses too), created without a listings cache: other processes (the
hosts of a pod) write into the same directories, and a cached listing would hide their files.
Object stores have no rename and no append, so writes replace whole objects (`write_bytes` is
atomic on local disks too: temporary file + rename) and `Appender` keeps what it has written to
rewrite it. A prepared dataset is read by ArrayRecord, which opens local files only:
`require_local` says how to mount a bucket instead.
"""

import contextlib
import os
import posixpath
import shutil
import threading
import time
import uuid
import zlib
from typing import IO, Iterator

_REMOTE_PREFIXES = ("gs://", "s3://", "az://", "gcs://")
_FILESYSTEMS: dict[tuple[str, int], object] = {}  # (protocol, pid) -> fsspec filesystem.
_FILESYSTEMS_LOCK = threading.Lock()


def is_remote(path: str | os.PathLike) -> bool:
  return os.fspath(path).startswith(_REMOTE_PREFIXES)


def _fs(path: str):
  """The fsspec filesystem of a remote path: one per protocol and process (fsspec's own cache
  would make one per thread, each with its own connection pool), no listings cache."""
  key = (path.split("://", 1)[0], os.getpid())
  with _FILESYSTEMS_LOCK:
    if key not in _FILESYSTEMS:
      import fsspec  # pylint: disable=g-import-not-at-top  (only for buckets)
      _FILESYSTEMS[key] = fsspec.filesystem(key[0], use_listings_cache=False,
                                            skip_instance_cache=True)
    return _FILESYSTEMS[key]


def absolute(path: str | os.PathLike) -> str:
  """An absolute local path, or the remote URL unchanged (`os.path.abspath` would mangle it)."""
  path = os.fspath(path)
  return path.rstrip("/") if is_remote(path) else os.path.abspath(path)


def join(*parts: str | os.PathLike) -> str:
  """Path join that keeps a URL's `//`."""
  first, rest = os.fspath(parts[0]), [os.fspath(p) for p in parts[1:]]
  return posixpath.join(first, *rest) if is_remote(first) else os.path.join(first, *rest)


def basename(path: str | os.PathLike) -> str:
  return posixpath.basename(os.fspath(path).rstrip("/"))


def exists(path: str | os.PathLike) -> bool:
  path = os.fspath(path)
  return _fs(path).exists(path) if is_remote(path) else os.path.exists(path)


def isdir(path: str | os.PathLike) -> bool:
  path = os.fspath(path)
  return _fs(path).isdir(path) if is_remote(path) else os.path.isdir(path)


def isfile(path: str | os.PathLike) -> bool:
  path = os.fspath(path)
  return _fs(path).isfile(path) if is_remote(path) else os.path.isfile(path)


def listdir(path: str | os.PathLike) -> list[str]:
  """Names in a directory (sorted); [] when it does not exist."""
  path = os.fspath(path)
  if not is_remote(path):
    return sorted(os.listdir(path)) if os.path.isdir(path) else []
  filesystem = _fs(path)
  try:
    found = filesystem.ls(path.rstrip("/"), detail=False)
  except FileNotFoundError:
    return []
  names = {basename(p) for p in found}
  names.discard(basename(path))  # A directory placeholder object lists itself.
  return sorted(n for n in names if n)


def glob(pattern: str) -> list[str]:
  """Files matching a glob pattern in a bucket (URLs, sorted). Local globs: `glob.glob`."""
  protocol = pattern.split("://", 1)[0]
  found = _fs(pattern).glob(pattern)
  return sorted(f"{protocol}://{p}" if "://" not in p else p for p in found
                if _fs(pattern).isfile(p))


def size(path: str | os.PathLike) -> int:
  """A file's size in bytes."""
  path = os.fspath(path)
  return int(_fs(path).size(path)) if is_remote(path) else os.path.getsize(path)


def makedirs(path: str | os.PathLike) -> None:
  """Creates a local directory and its parents (a bucket has no directories: a no-op there)."""
  path = os.fspath(path)
  if not is_remote(path):
    os.makedirs(path, exist_ok=True)


def _relative_files(path: str) -> Iterator[tuple[str, dict]]:
  """(path relative to the directory `path`, a bucket's object metadata or {}) of every file
  below it; one listing request in a bucket."""
  if is_remote(path):
    filesystem = _fs(path)
    root = filesystem._strip_protocol(path)  # pylint: disable=protected-access
    for found, info in filesystem.find(path, detail=True).items():
      relative = found[len(root):].lstrip("/")
      if relative:
        yield relative, info
    return
  for directory, _, names in os.walk(path):
    for name in names:
      yield os.path.relpath(os.path.join(directory, name), path), {}


def walk_files(path: str | os.PathLike) -> Iterator[str]:
  """Every file below a directory, as paths relative to it."""
  for relative, _ in _relative_files(os.fspath(path).rstrip("/")):
    yield relative


def describe_files(path: str | os.PathLike) -> dict[str, dict]:
  """{path relative to the directory: {"bytes": size, "checksum": content checksum}} of every
  file below it. The checksum is the object's own CRC-32C where the store keeps one (GCS: taken
  from the one listing, nothing downloaded), else the CRC-32 of the bytes, read in chunks."""
  path = os.fspath(path).rstrip("/")
  described = {}
  for relative, info in _relative_files(path):
    full = join(path, relative)
    if info.get("crc32c"):
      described[relative] = {"bytes": int(info["size"]), "checksum": f"crc32c:{info['crc32c']}"}
      continue
    crc, length = 0, 0
    with open_binary(full) as f:
      while chunk := f.read(1 << 20):
        crc, length = zlib.crc32(chunk, crc), length + len(chunk)
    described[relative] = {"bytes": length, "checksum": f"crc32:{crc:08x}"}
  return described


def open_binary(path: str | os.PathLike) -> IO[bytes]:
  """A file opened for reading bytes (a bucket's object streams: seekable, read in blocks)."""
  path = os.fspath(path)
  return _fs(path).open(path, "rb") if is_remote(path) else open(path, "rb")


def read_bytes(path: str | os.PathLike) -> bytes:
  path = os.fspath(path)
  if is_remote(path):
    return _fs(path).cat_file(path)
  with open(path, "rb") as f:
    return f.read()


def read_text(path: str | os.PathLike) -> str:
  return read_bytes(path).decode("utf-8")


def write_bytes(path: str | os.PathLike, data: bytes) -> None:
  """Replaces the file's content at once: readers see the old or the new, never a part."""
  path = os.fspath(path)
  if is_remote(path):
    _fs(path).pipe_file(path, data)  # An object upload is atomic.
    return
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  # Whatever stops it (an error, Ctrl-C's KeyboardInterrupt), no .tmp-* file stays.
  with local_file_in_place(path) as tmp:
    with open(tmp, "xb") as f:  # O_EXCL, mode 0666 less the umask (as for any open()).
      f.write(data)


def umask() -> int:
  """This process's umask (read without changing it where Linux says it)."""
  try:
    with open("/proc/self/status") as f:
      for line in f:
        if line.startswith("Umask:"):
          return int(line.split()[1], 8)
  except OSError:
    pass
  current = os.umask(0o022)
  os.umask(current)
  return current


@contextlib.contextmanager
def local_file_in_place(path: str | os.PathLike):
  """A temporary path beside local file `path` for a writer that opens files itself (e.g.
  safetensors, which creates them 0600): on success it gets the mode a plain open() gives
  (0666 less the umask) and replaces `path` at once; on any failure it is removed and `path`
  is untouched."""
  path = os.fspath(path)
  tmp = os.path.join(os.path.dirname(os.path.abspath(path)), f".tmp-{uuid.uuid4().hex}")
  try:
    yield tmp
    os.chmod(tmp, 0o666 & ~umask())
    os.replace(tmp, path)
  except BaseException:
    try:
      os.remove(tmp)
    except OSError:
      pass
    raise


def write_text(path: str | os.PathLike, text: str) -> None:
  write_bytes(path, text.encode("utf-8"))


def create_exclusive(path: str | os.PathLike, text: str) -> bool:
  """Creates the file with `text` only if there is none (O_EXCL locally, `ifGenerationMatch=0`
  in a bucket): True when this call created it, False when it existed (a lock is taken)."""
  path = os.fspath(path)
  try:
    if is_remote(path):
      with _fs(path).open(path, "xb") as f:
        f.write(text.encode("utf-8"))
    else:
      os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
      with open(path, "x", encoding="utf-8") as f:
        f.write(text)
  except FileExistsError:
    return False
  return True


def rename(source: str | os.PathLike, target: str | os.PathLike) -> None:
  """Moves a file or a directory (in a bucket: copy, then delete)."""
  source, target = os.fspath(source), os.fspath(target)
  if is_remote(source):
    _fs(source).mv(source, target, recursive=True)
  else:
    os.replace(source, target)


def remove_tree(path: str | os.PathLike) -> None:
  """Deletes a file or a directory with everything below it; nothing when it is absent."""
  path = os.fspath(path)
  if is_remote(path):
    if exists(path):
      _fs(path).rm(path, recursive=True)
  elif os.path.isdir(path):
    shutil.rmtree(path)
  elif os.path.exists(path):
    os.remove(path)


def copy_tree(source: str | os.PathLike, target: str | os.PathLike) -> None:
  """Copies a local directory to `target` (local or remote)."""
  source, target = os.fspath(source), os.fspath(target)
  if not is_remote(target):
    shutil.copytree(source, target)
    return
  for relative in walk_files(source):  # Streamed from disk, file by file.
    _fs(target).put_file(os.path.join(source, relative),
                         join(target, relative.replace(os.sep, "/")))


def require_local(path: str | os.PathLike, what: str) -> str:
  """`path` when it is local; a clear error when it is in a bucket, for readers (ArrayRecord)
  that open local files only."""
  path = os.fspath(path)
  if is_remote(path):
    bucket = path.split("/")[2]
    raise ValueError(
        f"{what} {path} is in a bucket, and ArrayRecord reads local files only: mount the bucket "
        f"with gcsfuse (e.g. `gcsfuse --implicit-dirs {bucket} /mnt/{bucket}`) and pass the "
        "mounted path (/mnt/" + "/".join(path.split("/")[2:]) + ")")
  return path


class Appender:
  """A text file that grows line by line (metrics.jsonl, train.log). Local: appended and
  flushed. Remote: objects cannot be appended, so the content (what was there at open, and
  what was added) is uploaded again when `flush_seconds` have passed since the last upload (in
  a background thread: a write never waits for the bucket), at `flush` and at `close`."""

  def __init__(self, path: str | os.PathLike, flush_seconds: float = 30.0):
    self.path = os.fspath(path)
    self._remote = is_remote(self.path)
    self._lock = threading.Lock()
    self._flush_seconds = flush_seconds
    if self._remote:
      self._content = read_text(self.path) if exists(self.path) else ""
      self._dirty, self._uploaded = False, time.time()
      self._uploader: threading.Thread | None = None  # The periodic upload in flight.
    else:
      os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
      self._file = open(self.path, "a", encoding="utf-8")

  def write(self, text: str) -> None:
    with self._lock:
      if not self._remote:
        self._file.write(text)
        self._file.flush()
        return
      self._content += text
      self._dirty = True
      due = time.time() - self._uploaded >= self._flush_seconds
      if due and (self._uploader is None or not self._uploader.is_alive()):
        self._uploaded = time.time()  # The next periodic upload counts from this one.
        self._uploader = threading.Thread(target=self._upload_quietly, daemon=True,
                                          name=f"upload {basename(self.path)}")
        self._uploader.start()

  def _upload(self) -> None:
    with self._lock:
      content, self._dirty = self._content, False
    try:
      write_text(self.path, content)
    except BaseException:
      with self._lock:
        self._dirty = True  # Uploaded again next time.
      raise
    self._uploaded = time.time()

  def _upload_quietly(self) -> None:
    try:
      self._upload()
    except Exception:  # pylint: disable=broad-except  (retried at the next upload; flush raises)
      pass

  def flush(self) -> None:
    """Uploads what was written so far (remote), waiting for it."""
    if not self._remote:
      return
    if self._uploader is not None:
      self._uploader.join()
    if self._dirty:
      self._upload()

  def close(self) -> None:
    if self._remote:
      self.flush()
    else:
      with self._lock:
        self._file.close()
