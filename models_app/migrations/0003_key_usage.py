"""The usage rows: tokens per inference key, model and UTC day (models_app.quotas.usage)."""
import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("models_app", "0002_inference_keys")]

    operations = [
        migrations.CreateModel(
            name="KeyUsage",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("model", models.CharField(max_length=128)),
                ("day", models.DateField()),
                ("input_tokens", models.PositiveBigIntegerField(default=0)),
                ("output_tokens", models.PositiveBigIntegerField(default=0)),
                ("requests", models.PositiveBigIntegerField(default=0)),
                ("key", models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name="usage",
                                          to="models_app.inferencekey")),
            ],
            options={
                "ordering": ["day", "model"],
                "indexes": [models.Index(fields=["day"], name="key_usage_day")],
                "constraints": [models.UniqueConstraint(fields=("key", "model", "day"), name="key_usage_per_model_day")],
            },
        ),
    ]
