"""A Redis server of this package's own (real, private), so no other test flushing DB 15 interferes.

The fixtures live in `tests.support.private_redis_fixtures` (shared with the
other package that needs one); importing them here scopes them to this package.
"""

from __future__ import annotations

from tests.support.private_redis_fixtures import private_redis_url, redis, settings

__all__ = ["private_redis_url", "redis", "settings"]
