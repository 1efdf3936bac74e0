from django.db import models


class CatalogModel(models.Model):
    """Mirror of one configured model, rewritten at start-up and after every successful reload."""

    name = models.CharField(max_length=128, unique=True)
    backend = models.CharField(max_length=32)
    enabled = models.BooleanField(default=False)
    definition = models.JSONField(help_text="The merged, validated definition.")
    sources = models.JSONField(default=list, help_text="The settings files that declare this model.")
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]
        verbose_name = "configured model"

    def __str__(self):
        return self.name
