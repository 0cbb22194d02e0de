"""API keys: create (shown once), list, revoke, and authenticate a presented key.

A key is `shv_<16 hex id>_<43 chars of secrets.token_urlsafe(32)>`: 256 random
bits. Only its SHA-256 is stored (a fast hash is right for a high-entropy
secret: there is nothing to brute-force); the id inside the key finds the row,
then the hashes are compared in constant time. Imported by the API (deps) and
the CLI (`sandhive keys`).
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import select

from app.db.engine import Sessions
from app.db.models import ApiKey
from app.errors import InvalidInput, NotFound
from app.ids import utc_now

KEY_PREFIX = "shv_"
ID_PREFIX = "key_"
TENANT_PATTERN = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,63}$")
_KEY_PATTERN = re.compile(r"^shv_([0-9a-f]{16})_([A-Za-z0-9_-]{43})$")
_ID_PATTERN = re.compile(r"^key_[0-9a-f]{16}$")


@dataclass(frozen=True)
class CreatedKey:
    id: str
    tenant: str
    key: str
    """The secret itself: shown once, never stored."""


@dataclass(frozen=True)
class KeyInfo:
    id: str
    tenant: str
    name: str
    created_at: datetime
    revoked_at: datetime | None


def check_tenant(name: str) -> str:
    """Tenant names: lowercase letters, digits, `_.-`, at most 64 characters."""
    if not TENANT_PATTERN.fullmatch(name):
        raise InvalidInput(
            f"invalid tenant name {name!r}: lowercase letters, digits, '_', '.', '-' (max 64)"
        )
    return name


def digest(secret: str) -> str:
    return hashlib.sha256(secret.encode("utf-8", errors="replace")).hexdigest()


def parse_key(key: str) -> str | None:
    """The row id a well-formed key names, or None (no database lookup for garbage)."""
    match = _KEY_PATTERN.fullmatch(key)
    return f"{ID_PREFIX}{match.group(1)}" if match else None


async def create_key(sessions: Sessions, tenant: str, name: str = "") -> CreatedKey:
    """A new key for the tenant; the returned `key` is the only copy there will ever be."""
    check_tenant(tenant)
    if len(name) > 200:
        raise InvalidInput("key name: at most 200 characters")
    hex_id = secrets.token_hex(8)
    key = f"{KEY_PREFIX}{hex_id}_{secrets.token_urlsafe(32)}"
    row = ApiKey(
        id=f"{ID_PREFIX}{hex_id}",
        tenant_id=tenant,
        name=name,
        key_sha256=digest(key),
        created_at=utc_now(),
    )
    async with sessions.begin() as session:
        session.add(row)
    return CreatedKey(id=row.id, tenant=tenant, key=key)


async def revoke_key(sessions: Sessions, key_id: str) -> KeyInfo:
    """Revoke at once (the next request with it answers 401); revoking twice is harmless."""
    if not _ID_PATTERN.fullmatch(key_id):
        raise NotFound(f"no API key {key_id!r}")
    async with sessions.begin() as session:
        row = await session.get(ApiKey, key_id, with_for_update=True)
        if row is None:
            raise NotFound(f"no API key {key_id!r}")
        if row.revoked_at is None:
            row.revoked_at = utc_now()
        return _info(row)


async def list_keys(sessions: Sessions, tenant: str | None = None) -> list[KeyInfo]:
    """Every key (of one tenant), oldest first, revoked ones included; never the secrets."""
    query = select(ApiKey).order_by(ApiKey.created_at, ApiKey.id)
    if tenant is not None:
        query = query.where(ApiKey.tenant_id == tenant)
    async with sessions() as session:
        return [_info(row) for row in await session.scalars(query)]


async def authenticate(sessions: Sessions, presented: str) -> str | None:
    """The tenant of a valid, unrevoked key; None for anything else."""
    key_id = parse_key(presented)
    if key_id is None:
        return None
    async with sessions() as session:
        row = await session.get(ApiKey, key_id)
    expected = row.key_sha256 if row is not None else "0" * 64
    matches = hmac.compare_digest(expected, digest(presented))
    if row is None or not matches or row.revoked_at is not None:
        return None
    return row.tenant_id


def is_admin_key(presented: str, admin_key: str | None) -> bool:
    """The operator's key from the configuration, compared in constant time."""
    if not admin_key:
        return False
    return hmac.compare_digest(digest(presented), digest(admin_key))


def _info(row: ApiKey) -> KeyInfo:
    return KeyInfo(
        id=row.id,
        tenant=row.tenant_id,
        name=row.name,
        created_at=row.created_at,
        revoked_at=row.revoked_at,
    )
