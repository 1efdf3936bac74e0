"""Usage rows of the keys of settings.json too: by name, as they have no row (models_app.quotas.usage)."""
import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("models_app", "0004_key_queue_timeout")]

    operations = [
        migrations.AlterField(
            model_name="keyusage", name="key",
            field=models.ForeignKey(null=True, on_delete=django.db.models.deletion.CASCADE, related_name="usage",
                                    to="models_app.inferencekey"),
        ),
        migrations.AddField(model_name="keyusage", name="settings_key", field=models.CharField(max_length=128, null=True)),
        migrations.AddConstraint(
            model_name="keyusage",
            constraint=models.UniqueConstraint(fields=("settings_key", "model", "day"),
                                               name="settings_key_usage_per_model_day"),
        ),
        migrations.AddConstraint(
            model_name="keyusage",
            constraint=models.CheckConstraint(condition=models.Q(key__isnull=True) ^ models.Q(settings_key__isnull=True),
                                              name="key_usage_of_one_key"),
        ),
    ]
