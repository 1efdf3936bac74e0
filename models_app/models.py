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


class InferenceKey(models.Model):
    """An inference key made through the admin API or ``manage.py create_api_key`` (the keys of
    settings.json are not rows: they are read from the file).  Only the sha256 of the secret is
    kept: the secret is random and 256 bits long, so a slow hash would add nothing.

    The limit fields are enforced at the edge (``models_app.quotas``, docs/api.md); ``priority``
    is the class the key's requests queue in, ``queue_timeout_seconds`` the longest they wait
    before they start, and ``weight`` their share in the token-fair order (docs/scheduling.md)."""

    name = models.CharField(max_length=128, unique=True)
    key_sha256 = models.CharField(max_length=64, unique=True)
    disabled = models.BooleanField(default=False)
    requests_per_minute = models.PositiveIntegerField(null=True)
    tokens_per_minute = models.PositiveBigIntegerField(null=True)
    max_concurrent = models.PositiveIntegerField(null=True)
    token_budget = models.PositiveBigIntegerField(null=True)
    budget_period = models.CharField(max_length=8, null=True)
    priority = models.CharField(max_length=16, default="default")
    fairness_key = models.CharField(max_length=256, null=True)
    weight = models.FloatField(null=True)
    queue_timeout_seconds = models.FloatField(null=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)
    # Last: the name hides the module ``models`` for the rest of the class body.
    models = models.JSONField(help_text='"*" or the list of models (names or aliases) the key may use.')

    class Meta:
        ordering = ["id"]

    def __str__(self):
        return self.name


class KeyRingVersion(models.Model):
    """One row whose ``version`` every change to the inference keys raises, in the change's own
    transaction: each API process compares it with the version its key ring holds."""

    version = models.BigIntegerField(default=0)


class KeyUsage(models.Model):
    """The tokens one key used on one model in one UTC day, written in batches by the API processes
    (``models_app.quotas.usage``): a database key's (``key``; a deleted key's rows go with it) or a
    key of settings.json's (``settings_key``, its name: its rows stay until they are pruned)."""

    key = models.ForeignKey(InferenceKey, on_delete=models.CASCADE, related_name="usage", null=True)
    settings_key = models.CharField(max_length=128, null=True)
    model = models.CharField(max_length=128)
    day = models.DateField()
    input_tokens = models.PositiveBigIntegerField(default=0)
    output_tokens = models.PositiveBigIntegerField(default=0)
    requests = models.PositiveBigIntegerField(default=0)

    class Meta:
        ordering = ["day", "model"]
        constraints = [
            models.UniqueConstraint(fields=["key", "model", "day"], name="key_usage_per_model_day"),
            models.UniqueConstraint(fields=["settings_key", "model", "day"], name="settings_key_usage_per_model_day"),
            models.CheckConstraint(condition=models.Q(key__isnull=True) ^ models.Q(settings_key__isnull=True),
                                   name="key_usage_of_one_key"),
        ]
        indexes = [models.Index(fields=["day"], name="key_usage_day")]
