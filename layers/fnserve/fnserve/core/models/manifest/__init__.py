"""The manifest format: every model version a deployment serves, its tensor overrides, its pipelines
(steps around a model) and its cascades, in a module for each part of the file: ``models`` (a model's entry, with
the ``providers`` it may name), ``steps`` and the ``pipelines`` they make, ``cascades``, worker ``groups``, and
``loading`` (the file whole: :class:`Manifest` and :func:`load_manifest`, the package's API); every table is an
``entries.Entry``.

A leaf: it knows msgspec and nothing of the features that read it. Each entry is a frozen ``msgspec.Struct``
validated from the parsed file by msgspec's compiled validator (``Entry.validate``), not by pydantic models, whose
import and build would weigh on every cold start (docs/design/start.md). TOML is what people
write; JSON (a TOML-shaped document) is what fnserve writes itself (an s3:// manifest fetched).
"""

from fnserve.core.models.manifest.loading import Manifest, load_manifest

__all__ = ["Manifest", "load_manifest"]
