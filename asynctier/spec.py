"""The layout of the primary buffer: chunk size, chunk count, namespace, and the layout digest."""

from __future__ import annotations

import hashlib
import operator
from dataclasses import dataclass, field

from .errors import TierConfigError

__all__ = ["FORMAT_VERSION", "OffloadingSpec", "as_byte_view"]

#: Version of the on-medium chunk format; part of the layout digest so formats never mix.
FORMAT_VERSION = 1

_MAX_NAMESPACE = 256


def as_byte_view(view: memoryview | bytearray | bytes, *, writable: bool = False) -> memoryview:
    """Return ``view`` as a flat, C-contiguous memoryview of unsigned bytes, without copying.

    Raises ``TypeError`` for an object that does not export the buffer protocol, a view that
    is not C-contiguous, or (with ``writable=True``) a read-only view.
    """
    try:
        mv = view if isinstance(view, memoryview) else memoryview(view)
    except TypeError:
        raise TypeError(
            f"primary_kv_view must support the buffer protocol (memoryview, bytearray, numpy array, "
            f"torch tensor via asynctier.torch_interop); got {type(view).__name__}"
        ) from None
    if not mv.c_contiguous:
        raise TypeError("primary_kv_view must be C-contiguous; got a strided view")
    if writable and mv.readonly:
        raise TypeError("primary_kv_view is read-only; loads need a writable buffer")
    if mv.format != "B" or mv.ndim != 1:
        mv = mv.cast("B")
    return mv


@dataclass(frozen=True)
class OffloadingSpec:
    """How the primary KV buffer is cut into chunks.

    Args:
        chunk_bytes: bytes per chunk (> 0).
        num_chunks: number of chunks in the primary buffer (> 0).
        namespace: names the model/dtype/parallelism the chunks belong to, for example
            ``"llama-3-8b/bf16/tp1"``. Part of the layout digest, so two models never share
            chunks even on one medium.

    The :attr:`layout_digest` (namespace, chunk size, format version) scopes every stored
    chunk; tiers store it with each chunk and refuse chunks of another layout.
    """

    chunk_bytes: int
    num_chunks: int
    namespace: str = "default"
    _digest: bytes = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        for name in ("chunk_bytes", "num_chunks"):
            value = getattr(self, name)
            if isinstance(value, bool):
                raise TierConfigError(f"OffloadingSpec.{name} must be a positive int; got {value!r}")
            try:
                # integers of any kind (numpy's, torch's from tensor.numel()), stored as int
                value = operator.index(value)
            except TypeError:
                raise TierConfigError(f"OffloadingSpec.{name} must be a positive int; got {value!r}") from None
            object.__setattr__(self, name, value)
            if value <= 0:
                raise TierConfigError(f"OffloadingSpec.{name} must be a positive int; got {value}")
        if not isinstance(self.namespace, str) or not self.namespace:
            raise TierConfigError(f"OffloadingSpec.namespace must be a non-empty str; got {self.namespace!r}")
        if len(self.namespace) > _MAX_NAMESPACE or not self.namespace.isprintable():
            raise TierConfigError(
                f"OffloadingSpec.namespace must be printable and at most {_MAX_NAMESPACE} characters; "
                f"got {self.namespace!r}"
            )
        h = hashlib.blake2b(digest_size=16)
        h.update(f"asynctier/v{FORMAT_VERSION}\0{self.chunk_bytes}\0{self.namespace}".encode())
        object.__setattr__(self, "_digest", h.digest())

    @property
    def total_bytes(self) -> int:
        """Size in bytes of the primary buffer this spec describes."""
        return self.chunk_bytes * self.num_chunks

    @property
    def layout_digest(self) -> bytes:
        """16 bytes identifying (format version, chunk size, namespace)."""
        return self._digest

    @property
    def layout_id(self) -> str:
        """The layout digest as 32 hex characters (used for directory names and key prefixes)."""
        return self._digest.hex()

    def check_view(self, view: memoryview | bytearray, *, writable: bool = True) -> memoryview:
        """Validate a primary buffer against this spec and return it as a flat byte view.

        Raises ``TypeError`` for an unusable buffer and ``ValueError`` if it is shorter than
        :attr:`total_bytes`.
        """
        mv = as_byte_view(view, writable=writable)
        if mv.nbytes < self.total_bytes:
            raise ValueError(
                f"primary_kv_view holds {mv.nbytes} bytes; this spec needs at least "
                f"{self.total_bytes} ({self.num_chunks} chunks x {self.chunk_bytes} bytes)"
            )
        return mv

    def check_chunk_id(self, chunk_id: object) -> int:
        """Return ``chunk_id`` as an int in ``[0, num_chunks)``, or raise ``TypeError``/``IndexError``."""
        if isinstance(chunk_id, bool):
            raise TypeError(f"chunk id must be an int; got bool {chunk_id!r}")
        try:
            cid = operator.index(chunk_id)  # type: ignore[arg-type]
        except TypeError:
            raise TypeError(f"chunk id must be an int; got {type(chunk_id).__name__} {chunk_id!r}") from None
        if not 0 <= cid < self.num_chunks:
            raise IndexError(f"chunk id {cid} out of range: accepted 0..{self.num_chunks - 1}")
        return cid

    def chunk_view(self, view: memoryview, chunk_id: int) -> memoryview:
        """Zero-copy slice of chunk ``chunk_id`` of a flat byte view (see :meth:`check_view`)."""
        start = chunk_id * self.chunk_bytes
        return view[start : start + self.chunk_bytes]
