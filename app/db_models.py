"""The table registry: imports every ORM module so ``Base.metadata`` is complete.

Alembic (``migrations/env.py``), the tests and every entry point that opens a ``Database``
(``app.main``, ``app.cli``, ``worker.tasks``) import it: a process that maps only the modules its
task needs would otherwise fail to resolve a foreign key at its first flush. It sits at the top of
the package graph because it names every domain's tables; ``app.core`` imports none of them.
"""

from app.auth.models import ApiKey, Tenant
from app.core.db import Base
from app.core.idempotency import IdempotencyRecord
from app.datasets.models import Dataset, DatasetItem, DatasetQuery
from app.embedders.models import Embedder
from app.galleries.models import AccessCount, AttachedOwner, Gallery, GalleryText, ReturnedWeight
from app.jobs.models import UpgradeJob
from app.migration.models import BackfillFit
from app.models.models import TrainedModel
from app.vectors.tables import AttachedPointId, GalleryVector, ReembeddedVector

__all__ = [
    "AccessCount",
    "ApiKey",
    "AttachedOwner",
    "AttachedPointId",
    "BackfillFit",
    "Base",
    "Dataset",
    "DatasetItem",
    "DatasetQuery",
    "Embedder",
    "Gallery",
    "GalleryText",
    "GalleryVector",
    "IdempotencyRecord",
    "ReembeddedVector",
    "ReturnedWeight",
    "Tenant",
    "TrainedModel",
    "UpgradeJob",
]
