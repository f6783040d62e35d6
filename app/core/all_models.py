"""Imports every ORM module so ``Base.metadata`` is complete (Alembic and tests use it)."""

from app.auth.models import ApiKey, Tenant
from app.core.db import Base
from app.core.idempotency import IdempotencyRecord
from app.datasets.models import Dataset, DatasetItem, DatasetQuery
from app.galleries.models import Gallery, GalleryVector
from app.galleries.reembed_models import BackfillFit, ReembeddedVector
from app.models.models import TrainedModel
from app.upgrades.models import UpgradeJob

__all__ = [
    "ApiKey",
    "BackfillFit",
    "Base",
    "Dataset",
    "DatasetItem",
    "DatasetQuery",
    "Gallery",
    "GalleryVector",
    "IdempotencyRecord",
    "ReembeddedVector",
    "Tenant",
    "TrainedModel",
    "UpgradeJob",
]
