"""Reads on the Django side."""
from models_app.models import CatalogModel


def catalog_list() -> list[CatalogModel]:
    return list(CatalogModel.objects.all())
