"""`/v1/llm/profiles`: the LLM profiles a tenant may use (what the page's picker offers).

Names, wire formats, default and allowed models, whether scripted, optional prices;
never a profile's URL or key.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from app.api.deps import Res, Tenant
from app.config import LLMProfile
from app.schemas.tasks import ErrorOut, LLMProfileList, LLMProfileOut

router = APIRouter(prefix="/v1/llm", tags=["llm"])

_ERRORS: dict[int | str, dict[str, Any]] = {401: {"model": ErrorOut}}


@router.get("/profiles", responses=_ERRORS)
async def list_profiles(res: Res, _tenant: Tenant) -> LLMProfileList:
    """Every profile (every tenant may use every one): `default` first, scripted ones last;
    and, when none is a real model, a notice saying what to set."""
    settings = res.settings
    profiles = [
        LLMProfileOut(name=name, **profile.model_dump(exclude={"base_url", "api_key"}))
        for name, profile in sorted(settings.llm_profiles().items(), key=_order)
    ]
    return LLMProfileList(profiles=profiles, notice=settings.no_model_notice())


def _order(item: tuple[str, LLMProfile]) -> tuple[bool, bool, str]:
    name, profile = item
    return profile.scripted, name != "default", name
