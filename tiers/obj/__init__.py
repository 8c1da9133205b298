"""``obj``: chunks in an object store — S3 and S3-compatible, GCS, Azure, a local directory, memory.

``{"type": "obj", "url": "s3://bucket/prefix", ...}``; also ``gs://bucket/prefix``,
``az://container/prefix`` (and the other Azure spellings obstore accepts), ``file:///dir`` and
``memory://``. Built on `obstore <https://developmentseed.org/obstore/>`_, imported by this
package only (``import asynctier`` never imports it). The object format, deadlines, retries,
the circuit breaker, the lookup cache, capacity and exit safety are described in
docs/tiers/obj.md.

Modules: :mod:`.url` (the ``url``), :mod:`.store` (building the obstore store),
:mod:`.params` (numeric parameters, deadlines), :mod:`.format` (object names and the header),
:mod:`.transfer` (PUT and GET of one object), :mod:`.client_errors` (obstore's errors as
per-chunk failures), :mod:`.redact` (secrets out of every text), :mod:`.breaker`,
:mod:`.lookup_cache`, :mod:`.exit_guard`, and :mod:`.tier` (the tier itself).
"""

from __future__ import annotations

from .client_errors import ObjectStoreIOError
from .tier import ObjTier

__all__ = ["ObjTier", "ObjectStoreIOError"]
