"""Input files read as byte streams, compressed or not (.gz, .zst), each checked to its end: a
file that ends early or fails its checksum is a DamagedCompressedFile naming it, never text
that silently stops; and the lines of a byte range of a plain file, for tasks that split one."""

from __future__ import annotations

import gzip
import io
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import zstandard

from hanlm.errors import UserError


class DamagedCompressedFile(UserError):
    """A compressed file that ends early or fails its checksum: it cannot be read to its end."""

    def __init__(self, path: Path, detail: str):
        self.path, self.detail = Path(path), detail
        super().__init__(
            f"the compressed file is damaged ({detail})",
            where=str(path),
            fix="copy or download it again (`gzip -t` or `zstd -t` checks a file), or leave it out",
        )

    def __reduce__(self):  # raised in worker processes: must cross back to the parent intact
        return (type(self), (self.path, self.detail))


class _CheckedGzip(io.RawIOBase):
    """A gzip file's decompressed bytes; gzip checks every member's CRC and length as it ends,
    and a file cut short or failing that check raises DamagedCompressedFile."""

    def __init__(self, path: Path):
        self._path = path
        self._gzip = gzip.open(path, "rb")  # noqa: SIM115 - closed in close()

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        try:
            # read1: at most one step of decompression, so what came before damage is handed out
            data = self._gzip.read1(len(buffer))
        except EOFError:
            raise DamagedCompressedFile(
                self._path, "truncated: it ends inside a gzip member"
            ) from None
        except (gzip.BadGzipFile, zlib.error) as e:
            raise DamagedCompressedFile(self._path, f"gzip: {e}") from None
        buffer[: len(data)] = data
        return len(data)

    def close(self) -> None:
        if not self.closed:
            self._gzip.close()
        super().close()


class _CheckedZstd(io.RawIOBase):
    """Every zstd frame of a file, decompressed; a frame cut short by the end of the file, a
    checksum mismatch or bytes that are not zstd raise DamagedCompressedFile.

    zstandard's stream_reader stops quietly at the end of the input even inside a frame, so
    truncation would pass unnoticed: frames are decoded one by one here and the last one must
    end with the file."""

    _INPUT_CHUNK = 1 << 16  # compressed bytes per step: bounds the memory one step decodes into

    def __init__(self, path: Path):
        self._path = path
        self._file = open(path, "rb")  # noqa: SIM115 - closed in close()
        self._frame = None  # the decompressor of the frame in progress
        self._pending = memoryview(b"")  # decompressed bytes not yet handed out
        self._at_end = False

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        while not self._pending and not self._at_end:
            self._pending = memoryview(self._decode_next_chunk())
        count = min(len(buffer), len(self._pending))
        buffer[:count] = self._pending[:count]
        self._pending = self._pending[count:]
        return count

    def _decode_next_chunk(self) -> bytes:
        chunk = self._file.read(self._INPUT_CHUNK)
        if not chunk:
            self._at_end = True
            if self._frame is not None:
                raise DamagedCompressedFile(self._path, "truncated: it ends inside a zstd frame")
            return b""
        out = []
        try:
            while chunk:
                if self._frame is None:
                    self._frame = zstandard.ZstdDecompressor().decompressobj()
                out.append(self._frame.decompress(chunk))
                if self._frame.eof:  # the next frame starts in what this one left over
                    chunk = self._frame.unused_data
                    self._frame = None
                else:
                    chunk = b""
        except zstandard.ZstdError as e:
            raise DamagedCompressedFile(self._path, str(e)) from None
        return b"".join(out)

    def close(self) -> None:
        if not self.closed:
            self._file.close()
        super().close()


def open_text_stream(path: Path) -> IO[bytes]:
    """Open a possibly .gz or .zst compressed file as a binary stream of its decompressed bytes.

    Compressed files are checked as they are read: reading one to its end raises
    DamagedCompressedFile (a UserError) when it is truncated or fails its checksum."""
    path = Path(path)
    name = path.name.lower()
    if name.endswith(".gz"):
        return io.BufferedReader(_CheckedGzip(path), buffer_size=1 << 16)
    if name.endswith(".zst"):
        return io.BufferedReader(_CheckedZstd(path), buffer_size=1 << 16)
    return open(path, "rb")


def lines_in_range(path: Path, start: int, end: int) -> Iterator[tuple[int, bytes]]:
    """(offset, raw line) of each line of an uncompressed file that starts in [start, end):
    cutting a file at any byte offsets gives every line to exactly one range."""
    with open(path, "rb") as f:
        if start > 0:
            f.seek(start - 1)
            if f.read(1) != b"\n":
                f.readline()  # the line that started before the range belongs to the one before
        offset = f.tell()
        while offset < end:
            raw = f.readline()
            if not raw:
                return
            yield offset, raw
            offset += len(raw)


def strip_compression_suffix(name: str) -> str:
    lower = name.lower()
    for suffix in (".gz", ".zst"):
        if lower.endswith(suffix):
            return name[: -len(suffix)]
    return name
