"""The pool: every model's writer and the reload (``model_pool``), the catalog and its one name
rule, swap groups, memory budgets and estimates, and the model files they read."""
