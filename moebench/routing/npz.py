"""Reading a recording's `.npz` members without trusting the file (routing/file.py's format).

`np.load` would inflate whatever a member's header claims: a few MB of deflated zeros can
inflate to gigabytes, and a member cut short surfaces as NumPy's EOF `ValueError`, which
reads like an object array's refusal. Here each member is checked before it is read:

- its uncompressed size (the zip directory's `file_size`) against a limit (MAX_MEMBER_BYTES,
  `MOEBENCH_ROUTING_MAX_BYTES` to change it): over it, one line naming the file, the member,
  its size and the limit, nothing inflated;
- its `.npy` header: an object dtype is refused (nothing is unpickled); a shape whose bytes the
  member does not hold is a member cut short (truncated or corrupt);
- then it is read, and any failure (a bad CRC, a broken deflate stream) names the member.

Every error is `MemberError` (a ValueError); routing/file.py adds the file's name and the
`workload.routing_file=` it came from."""

from __future__ import annotations

import math
import os
import zipfile
import zlib

import numpy as np

MAX_MEMBER_BYTES = 1 << 30  # 1 GiB: a recording of 16M tokens of top-8 int64 ids (a day of serving)
LIMIT_ENV = "MOEBENCH_ROUTING_MAX_BYTES"


class MemberError(ValueError):
    """A member (or the archive) that cannot be read: the message names the member."""


def limit() -> int:
    """The largest uncompressed member, in bytes (MOEBENCH_ROUTING_MAX_BYTES, else MAX_MEMBER_BYTES)."""
    text = os.environ.get(LIMIT_ENV, "").strip()
    if not text:
        return MAX_MEMBER_BYTES
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value <= 0:
        raise MemberError(f"{LIMIT_ENV}={text!r} is no byte count: give a positive integer, or unset it")
    return value


def _header(f) -> tuple[tuple, np.dtype, int]:
    """(shape, dtype, header length) of the .npy stream `f`."""
    version = np.lib.format.read_magic(f)
    if version == (1, 0):
        shape, _, dtype = np.lib.format.read_array_header_1_0(f)
    else:
        shape, _, dtype = np.lib.format.read_array_header_2_0(f)
    return shape, dtype, f.tell()


def members(zf: zipfile.ZipFile) -> dict[str, zipfile.ZipInfo]:
    """array name -> its member (`name.npy`, as np.load names them)."""
    return {i.filename.removesuffix(".npy"): i for i in zf.infolist() if not i.is_dir()}


def read_member(zf: zipfile.ZipFile, info: zipfile.ZipInfo, max_bytes: int) -> np.ndarray:
    """One member's array, checked before it is read (module doc). MemberError naming it."""
    name = info.filename
    if info.file_size > max_bytes:
        raise MemberError(
            f"member {name} inflates to {info.file_size:,} bytes, over the limit of {max_bytes:,} "
            f"({LIMIT_ENV} raises it; split a larger recording by layer): nothing was inflated"
        )
    try:
        with zf.open(info) as f:
            shape, dtype, at = _header(f)
            if dtype.hasobject:
                raise MemberError(
                    f"member {name} holds an object array, which cannot be read without unpickling: "
                    "save plain numeric arrays"
                )
            need = math.prod(shape) * dtype.itemsize
            if need > info.file_size - at:
                raise MemberError(
                    f"member {name} is truncated or corrupt: its header promises {need:,} bytes of "
                    f"{dtype} {list(shape)}, it holds {max(info.file_size - at, 0):,}"
                )
        with zf.open(info) as f:
            return np.lib.format.read_array(f, allow_pickle=False)
    except MemberError:
        raise
    except (ValueError, OSError, EOFError, zipfile.BadZipFile, zlib.error) as e:
        raise MemberError(f"member {name} is truncated or corrupt ({type(e).__name__}: {e})") from None
