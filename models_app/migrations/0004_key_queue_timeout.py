"""An inference key's queue timeout: the longest its requests wait before they start (docs/scheduling.md)."""
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("models_app", "0003_key_usage")]

    operations = [
        migrations.AddField(model_name="inferencekey", name="queue_timeout_seconds", field=models.FloatField(null=True)),
    ]
