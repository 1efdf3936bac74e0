"""Every API test module runs twice: on the embedded default and on the production split."""
import pytest

from tests.conftest import DEFAULT_MODE


@pytest.fixture(scope="module", params=["embedded", "split"], autouse=True)
def api_shape(request):
    DEFAULT_MODE["mode"] = request.param
    yield request.param
    DEFAULT_MODE["mode"] = "embedded"


@pytest.fixture
def http(service):
    """An HTTP client for the module's ``service``."""
    with service.client() as client:
        yield client
