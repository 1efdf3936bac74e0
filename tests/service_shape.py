"""The shape a ``LiveService`` takes when a test names none (``tests/api`` runs each module in both).

One dict, in a module of its own that everything imports as ``tests.service_shape``: pytest imports
``tests/conftest.py`` as ``conftest`` (for its fixtures) while test modules import it as
``tests.conftest``, two modules with globals of their own, so a flag kept there and set through one
of them was not seen by the other (the ``live_service`` fixture started embedded services in the
split runs of tests/api)."""

DEFAULT_MODE = {"mode": "embedded"}
