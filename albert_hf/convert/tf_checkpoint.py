"""Read TensorFlow checkpoints (the V2 "tensor bundle" format) with numpy and the standard library only.

A checkpoint `PREFIX` is two kinds of files:
- `PREFIX.index`: a LevelDB-style sorted table (SSTable). Its keys are variable names; each value is a serialized
  `BundleEntryProto` (dtype, shape, shard id, byte offset, byte size, masked CRC32C of the bytes). The empty key
  holds the `BundleHeaderProto` (number of shards, byte order).
- `PREFIX.data-SSSSS-of-NNNNN`: the raw tensor bytes, row-major, back to back.

Only what TensorFlow writes for ordinary variables is supported: uncompressed table blocks, little-endian data,
numeric dtypes, no partitioned (sliced) variables. Every table block and every tensor read is checked against its
CRC32C, so a truncated or corrupted file is reported by name instead of giving wrong weights.
"""

from __future__ import annotations

import math
import re
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import InputError
from ..protobuf_wire import proto_fields, varint

TABLE_MAGIC = 0xDB4775248B80FB57  # LevelDB's table magic number, the last 8 bytes of the .index file
FOOTER_SIZE = 48  # two block handles (varints) padded to 40 bytes, then the magic
BLOCK_TRAILER_SIZE = 5  # compression type (1 byte) + masked CRC32C (4 bytes)

# tensorflow/core/framework/types.proto: DataType -> numpy dtype (little-endian)
DTYPES = {
    1: np.dtype("<f4"),  # DT_FLOAT
    2: np.dtype("<f8"),  # DT_DOUBLE
    3: np.dtype("<i4"),  # DT_INT32
    4: np.dtype("u1"),  # DT_UINT8
    5: np.dtype("<i2"),  # DT_INT16
    6: np.dtype("i1"),  # DT_INT8
    9: np.dtype("<i8"),  # DT_INT64
    10: np.dtype("?"),  # DT_BOOL
    17: np.dtype("<u2"),  # DT_UINT16
    19: np.dtype("<f2"),  # DT_HALF
    22: np.dtype("<u4"),  # DT_UINT32
    23: np.dtype("<u8"),  # DT_UINT64
}
DT_BFLOAT16 = 14
DTYPE_NAMES = {7: "string", DT_BFLOAT16: "bfloat16"}


class TFCheckpointError(InputError):
    """The files are not a readable TensorFlow checkpoint (missing, truncated, corrupted or unsupported)."""


# ----------------------------------------------------------------------------------------------------------------
# CRC32C (Castagnoli), as TensorFlow and LevelDB checksum their data


def _crc_table() -> np.ndarray:
    table = np.zeros(256, dtype=np.uint32)
    for byte in range(256):
        crc = byte
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
        table[byte] = crc
    return table


CRC_TABLE = _crc_table()
_CRC_LIST = CRC_TABLE.tolist()


def _crc_update_scalar(register: int, data) -> int:
    table = _CRC_LIST
    for byte in data:
        register = table[(register ^ byte) & 0xFF] ^ (register >> 8)
    return register


def _zero_shift_tables(length: int) -> list[list[int]]:
    """Tables that advance a CRC register over `length` zero bytes: the advance is linear in the register, so it is
    the XOR of its effect on each of the register's four bytes."""
    values = (np.arange(256, dtype=np.uint32)[None, :] << (8 * np.arange(4, dtype=np.uint32)[:, None])).ravel()
    for _ in range(length):
        values = CRC_TABLE[values & 0xFF] ^ (values >> 8)
    return values.reshape(4, 256).tolist()


def crc32c(data) -> int:
    """CRC32C of `data` (bytes-like). Large buffers are split into equal chunks whose registers are computed side by
    side with numpy, then chained (a register over chunk A then B = A's register advanced over len(B) zero bytes,
    XOR B's register from zero), so a 100 MB tensor takes about a second, not minutes."""
    view = memoryview(data).cast("B")
    size = len(view)
    if size < 1 << 14:
        return _crc_update_scalar(0xFFFFFFFF, view) ^ 0xFFFFFFFF
    chunk = max(256, math.isqrt(size))
    chunks = size // chunk
    columns = np.frombuffer(view, dtype=np.uint8, count=chunks * chunk).reshape(chunks, chunk).T.copy()
    registers = np.zeros(chunks, dtype=np.uint32)
    for row in columns:
        registers = CRC_TABLE[(registers ^ row) & 0xFF] ^ (registers >> 8)
    shift0, shift1, shift2, shift3 = _zero_shift_tables(chunk)
    register = 0xFFFFFFFF
    for chunk_register in registers.tolist():
        register = (
            shift0[register & 0xFF]
            ^ shift1[(register >> 8) & 0xFF]
            ^ shift2[(register >> 16) & 0xFF]
            ^ shift3[register >> 24]
            ^ chunk_register
        )
    register = _crc_update_scalar(register, view[chunks * chunk :])
    return register ^ 0xFFFFFFFF


def masked_crc32c(data) -> int:
    """The form LevelDB and TensorFlow store (rotated and offset, so a CRC of data holding CRCs stays strong)."""
    crc = crc32c(data)
    return ((((crc >> 15) | (crc << 17)) & 0xFFFFFFFF) + 0xA282EAD8) & 0xFFFFFFFF


# ----------------------------------------------------------------------------------------------------------------
# The table format (protobuf fields: protobuf_wire.py)


def _block_entries(block: bytes):
    """(key, value) pairs of one table block: prefix-compressed keys, then the restart offsets (ignored here, the
    block is read front to back), then their count."""
    (restarts,) = struct.unpack_from("<I", block, len(block) - 4)
    end = len(block) - 4 * (restarts + 1)
    if end < 0:
        raise ValueError("block restart count exceeds the block")
    position, key = 0, b""
    while position < end:
        shared, position = varint(block, position)
        unshared, position = varint(block, position)
        value_length, position = varint(block, position)
        key = key[:shared] + block[position : position + unshared]
        position += unshared
        value = block[position : position + value_length]
        position += value_length
        if position > end:
            raise ValueError("block entry runs past the end of the block")
        yield key, value


@dataclass(frozen=True)
class TensorEntry:
    """Where one variable's bytes are: from a BundleEntryProto."""

    name: str
    dtype: int
    shape: tuple[int, ...]
    shard: int
    offset: int
    size: int
    crc: int | None
    sliced: bool

    @property
    def dtype_name(self) -> str:
        return str(DTYPES[self.dtype]) if self.dtype in DTYPES else DTYPE_NAMES.get(self.dtype, f"dtype {self.dtype}")


def _parse_entry(name: str, value: bytes) -> TensorEntry:
    dtype, shape, shard, offset, size, crc, sliced = 0, (), 0, 0, 0, None, False
    for field, content in proto_fields(value):
        if field == 1:
            dtype = content
        elif field == 2:  # TensorShapeProto: repeated Dim dim = 2 { int64 size = 1; string name = 2 }
            dims = []
            for shape_field, dim in proto_fields(content):
                if shape_field == 2:
                    dims.append(next((v for f, v in proto_fields(dim) if f == 1), 0))
                elif shape_field == 3 and dim:
                    raise ValueError(f"{name} has an unknown rank")
            shape = tuple(dims)
        elif field == 3:
            shard = content
        elif field == 4:
            offset = content
        elif field == 5:
            size = content
        elif field == 6:
            (crc,) = struct.unpack("<I", content)
        elif field == 7:
            sliced = True
    return TensorEntry(name, dtype, shape, shard, offset, size, crc, sliced)


# ----------------------------------------------------------------------------------------------------------------
# Finding and reading a checkpoint


def resolve_prefix(path) -> Path:
    """The checkpoint prefix for `path`: a prefix (PREFIX.index beside it), the .index or a .data-* file itself, or a
    folder holding one checkpoint (the one its `checkpoint` file names, else the only *.index in it)."""
    path = Path(path)
    text = str(path)
    match = re.match(r"(.*)\.(index|data-\d{5}-of-\d{5})$", text)
    if match and path.is_file():
        return Path(match.group(1))
    if Path(text + ".index").is_file():
        return path
    if path.is_dir():
        state = path / "checkpoint"
        if state.is_file():
            named = re.search(r'^model_checkpoint_path:\s*"(.*)"', state.read_text(errors="replace"), re.M)
            if named:
                prefix = Path(named.group(1))
                prefix = prefix if prefix.is_absolute() else path / prefix
                if Path(str(prefix) + ".index").is_file():
                    return prefix
        indexes = sorted(path.glob("*.index"))
        if len(indexes) == 1:
            return indexes[0].with_suffix("")
        if len(indexes) > 1:
            names = ", ".join(index.name for index in indexes)
            raise FileNotFoundError(f"the folder holds several checkpoints ({names}); pass the prefix of one")
        raise FileNotFoundError("a folder without a TensorFlow checkpoint (no *.index file)")
    raise FileNotFoundError(
        f"no such TensorFlow checkpoint (expected {path.name}.index and {path.name}.data-*, "
        "a folder holding them, or one of those files)"
    )


class TFCheckpoint:
    """The variables of one TensorFlow checkpoint: `names()`, `entry(name)`, `read(name)` -> numpy array."""

    def __init__(self, path):
        self.prefix = resolve_prefix(path)
        self.index_path = Path(str(self.prefix) + ".index")
        self.num_shards = 1
        self.entries: dict[str, TensorEntry] = {}
        self._read_index()

    def _fail(self, what: str) -> TFCheckpointError:
        return TFCheckpointError(f"{self.index_path}: {what}")

    def _block(self, table: bytes, handle: bytes, what: str) -> bytes:
        offset, position = varint(handle, 0)
        size, _ = varint(handle, position)
        end = offset + size + BLOCK_TRAILER_SIZE
        if end > len(table):
            raise self._fail(f"truncated: the {what} block ends at byte {end}, the file has {len(table)} bytes")
        block = table[offset : offset + size]
        compression = table[offset + size]
        (stored,) = struct.unpack_from("<I", table, offset + size + 1)
        if masked_crc32c(table[offset : offset + size + 1]) != stored:
            raise self._fail(f"corrupted: checksum mismatch in the {what} block at byte {offset}")
        if compression != 0:
            raise self._fail(f"compressed table blocks (type {compression}) are not supported")
        return block

    def _read_index(self):
        table = self.index_path.read_bytes()
        if len(table) < FOOTER_SIZE:
            raise self._fail(f"truncated: {len(table)} bytes, shorter than the table footer")
        footer = table[-FOOTER_SIZE:]
        (magic,) = struct.unpack_from("<Q", footer, FOOTER_SIZE - 8)
        if magic != TABLE_MAGIC:
            raise self._fail(
                "not a TensorFlow checkpoint index (no table magic at its end: truncated, corrupted, "
                "or a V1 checkpoint)"
            )
        try:
            _, position = varint(footer, 0)  # the metaindex block handle (offset, size): unused by TensorFlow
            _, start = varint(footer, position)
            _, position = varint(footer, start)
            _, end = varint(footer, position)
            index_block = self._block(table, footer[start:end], "index")
            for _, handle in _block_entries(index_block):
                for key, value in _block_entries(self._block(table, handle, "data")):
                    name = key.decode("utf-8")
                    if name == "":
                        self._read_header(value)
                    else:
                        self.entries[name] = _parse_entry(name, value)
        except (IndexError, ValueError, struct.error, UnicodeDecodeError) as error:
            if isinstance(error, TFCheckpointError):
                raise
            raise self._fail(f"corrupted: cannot parse the table ({error})") from None

    def _read_header(self, value: bytes):
        for field, content in proto_fields(value):
            if field == 1:
                self.num_shards = content
            elif field == 2 and content != 0:
                raise self._fail("big-endian checkpoints are not supported")

    def names(self) -> list[str]:
        return sorted(self.entries)

    def entry(self, name: str) -> TensorEntry:
        return self.entries[name]

    def shard_path(self, shard: int) -> Path:
        return Path(f"{self.prefix}.data-{shard:05d}-of-{self.num_shards:05d}")

    def read(self, name: str) -> np.ndarray:
        """The variable's value, checked against the size and CRC32C the index records for it."""
        entry = self.entries[name]
        if entry.sliced:
            raise TFCheckpointError(f"{name} is a partitioned (sliced) variable, which is not supported")
        if entry.dtype not in DTYPES:
            raise TFCheckpointError(f"{name} has {entry.dtype_name} values, which are not supported")
        dtype = DTYPES[entry.dtype]
        expected = math.prod(entry.shape) * dtype.itemsize
        if expected != entry.size:
            raise self._fail(
                f"corrupted: {name} has shape {list(entry.shape)} ({expected} bytes of {dtype}) but "
                f"the index gives {entry.size} bytes"
            )
        shard = self.shard_path(entry.shard)
        if not shard.is_file():
            raise TFCheckpointError(f"{shard}: missing (the data shard holding {name})")
        with open(shard, "rb") as file:
            file.seek(entry.offset)
            data = file.read(entry.size)
        if len(data) != entry.size:
            have = shard.stat().st_size
            end = entry.offset + entry.size
            raise TFCheckpointError(
                f"{shard}: truncated: {name} needs bytes {entry.offset}..{end} but the file has {have} bytes"
            )
        if entry.crc is not None and masked_crc32c(data) != entry.crc:
            raise TFCheckpointError(f"{shard}: corrupted: the bytes of {name} do not match their checksum")
        return np.frombuffer(data, dtype=dtype).reshape(entry.shape).copy()


__all__ = ["TFCheckpoint", "TFCheckpointError", "TensorEntry", "crc32c", "masked_crc32c", "resolve_prefix"]
