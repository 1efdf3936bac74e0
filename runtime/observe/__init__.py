"""What is observed: the activity records, the Prometheus metrics, model logs and the read models
the admin API and the workbench show."""
