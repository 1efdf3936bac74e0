"""The model writer: the lifecycle table (``state``), the one writer per model (``writer``), the
typed commands it takes, its collaborators (residency, the memory claim, the swap-group turn, load
on request, replicas, load progress) and the token-fair scheduler."""
