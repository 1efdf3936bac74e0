"""Writes on the Django side."""
from django.db import transaction

from models_app.models import CatalogModel


@transaction.atomic
def catalog_sync(models: list[dict]) -> None:
    """Make the catalog mirror equal to the runtime's catalog (one row per configured model)."""
    names = [model["name"] for model in models]
    CatalogModel.objects.exclude(name__in=names).delete()
    for model in models:
        row = CatalogModel.objects.filter(name=model["name"]).first()
        values = {key: model[key] for key in ("backend", "enabled", "definition", "sources")}
        if row is None:
            CatalogModel.objects.create(name=model["name"], **values)
        elif any(getattr(row, key) != value for key, value in values.items()):
            for key, value in values.items():
                setattr(row, key, value)
            row.save()
