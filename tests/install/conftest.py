"""The real servers the install smokes talk to: the functional tests' moto server and redis-server."""

from tests.functional.conftest import moto_url, redis_url

__all__ = ["moto_url", "redis_url"]
