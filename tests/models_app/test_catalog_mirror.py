"""The catalog mirror: synced rows, and read-only in the Django admin."""
import pytest
from django.contrib.auth.models import User

from models_app.models import CatalogModel
from models_app.services import catalog_sync

pytestmark = pytest.mark.django_db


def row(name, **extra):
    return {"name": name, "backend": "stub", "enabled": False, "definition": {"backend": "stub"},
            "sources": ["settings.json"], **extra}


def test_sync_adds_updates_and_removes_rows():
    catalog_sync([row("a"), row("b")])
    catalog_sync([row("a", enabled=True, sources=["settings.json", "local.json"]), row("c")])
    rows = {r.name: r for r in CatalogModel.objects.all()}
    assert sorted(rows) == ["a", "c"]
    assert rows["a"].enabled is True
    assert rows["a"].sources == ["settings.json", "local.json"]


def test_unchanged_rows_keep_their_timestamp():
    catalog_sync([row("a")])
    first = CatalogModel.objects.get(name="a").updated_at
    catalog_sync([row("a")])
    assert CatalogModel.objects.get(name="a").updated_at == first


def test_admin_shows_the_catalog_read_only(client):
    catalog_sync([row("visible")])
    User.objects.create_superuser("op", "op@example.com", "pw")
    client.login(username="op", password="pw")
    listing = client.get("/admin/models_app/catalogmodel/")
    assert listing.status_code == 200
    assert b"visible" in listing.content
    assert b"/admin/models_app/catalogmodel/add/" not in listing.content
    assert client.get("/admin/models_app/catalogmodel/add/").status_code == 403
    pk = CatalogModel.objects.get(name="visible").pk
    change = client.post(f"/admin/models_app/catalogmodel/{pk}/change/", {"name": "renamed"})
    assert change.status_code == 403
    assert CatalogModel.objects.get(pk=pk).name == "visible"
