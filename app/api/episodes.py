"""`/v1/episodes`: an RL environment a trainer drives turn by turn (docs/rl.md).

Routes parse and call `services.episodes_calls`; the sandbox lives in a worker.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Header, Query, Response, status

from app.api.deps import Res, Tenant
from app.api.query import known_query_only
from app.schemas.episodes import (
    EpisodeCreate,
    EpisodeForkIn,
    EpisodeForkOut,
    EpisodeOpened,
    EpisodeOut,
    EpisodeStepIn,
    EpisodeStepOut,
    RewardOut,
)
from app.schemas.tasks import ErrorOut
from app.services.episodes import calls as episodes_calls
from app.services.episodes import forks as episode_forks
from app.services.episodes import reward as episodes_reward
from app.services.episodes import service as episodes
from app.services.episodes import trajectory as episode_trajectory_service

router = APIRouter(prefix="/v1/episodes", tags=["episodes"])

_ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorOut} for code in (401, 404, 409, 422, 429, 503)
}


@router.post(
    "", status_code=status.HTTP_201_CREATED, response_model=EpisodeOpened, responses=_ERRORS
)
async def create_episode(
    body: EpisodeCreate, response: Response, res: Res, tenant: Tenant
) -> EpisodeOpened:
    """Open an episode: a sandbox on some worker, and the first messages and tool schemas."""
    opened = await episodes_calls.open_episode(res.sessions, res.redis, res.settings, tenant, body)
    response.headers["Location"] = f"/v1/episodes/{opened.id}"
    return opened


@router.get("/{episode_id}", response_model=EpisodeOut, responses=_ERRORS)
async def get_episode(episode_id: str, res: Res, tenant: Tenant) -> EpisodeOut:
    return episodes.out(await episodes.find(res.sessions, tenant, episode_id))


@router.get(
    "/{episode_id}/trajectory",
    response_model=dict[str, Any],
    responses=_ERRORS,
    dependencies=[known_query_only()],
)
async def episode_trajectory(
    episode_id: str,
    res: Res,
    tenant: Tenant,
    format: Annotated[Literal["atif"], Query()] = "atif",
) -> dict[str, Any]:
    """The ended episode in Harbor's Agent Trajectory Interchange Format (ATIF v1.7): its
    prompt, each model turn with its tool call and observation (docs/records.md). 409
    while it is open: its steps are stored once, as it ends."""
    return await episode_trajectory_service.episode_atif(res.sessions, tenant, episode_id)


@router.post("/{episode_id}/step", response_model=EpisodeStepOut, responses=_ERRORS)
async def step_episode(
    episode_id: str,
    body: EpisodeStepIn,
    res: Res,
    tenant: Tenant,
    idempotency_key: Annotated[str | None, Header(min_length=1, max_length=200)] = None,
) -> EpisodeStepOut:
    """Run the trainer's turn; 409 once the episode is done, 503 when its worker is lost.
    A repeat with the same `Idempotency-Key` gets the first one's answer (the turn runs
    once); the same key with another message is a 422."""
    return await episodes_calls.step(
        res.sessions, res.redis, res.settings, tenant, episode_id, body.message, idempotency_key
    )


@router.post(
    "/{episode_id}/fork",
    status_code=status.HTTP_201_CREATED,
    response_model=EpisodeForkOut,
    responses=_ERRORS,
)
async def fork_episode(
    episode_id: str, res: Res, tenant: Tenant, body: EpisodeForkIn | None = None
) -> EpisodeForkOut:
    """Fork an open episode into `n` children at its current step (docs/fork.md): each
    child's history is the parent's so far and its sandbox a copy of the parent's files;
    the parent pauses for the snapshot, then goes on. 409 once the parent ended, 422 over
    `SANDHIVE_FORK_MAX_CHILDREN` or the snapshot limit, 429 over the tenant's cap or the
    worker's free episode slots."""
    n = body.n if body is not None else 1
    return await episode_forks.fork(res.sessions, res.redis, res.settings, tenant, episode_id, n)


@router.post("/{episode_id}/reward", response_model=RewardOut, responses=_ERRORS)
async def reward_episode(episode_id: str, res: Res, tenant: Tenant) -> RewardOut:
    """The episode's scorer on its answer; 0 with the reason when it never submitted."""
    row = await episodes.find(res.sessions, tenant, episode_id)
    return await episodes_reward.reward(res.sessions, res.redis, res.settings, row)


@router.delete("/{episode_id}", response_model=EpisodeOut, responses=_ERRORS)
async def delete_episode(episode_id: str, res: Res, tenant: Tenant) -> EpisodeOut:
    """Close it and remove its sandbox (an ended one is only marked closed)."""
    row = await episodes_calls.close(res.sessions, res.redis, res.settings, tenant, episode_id)
    return episodes.out(row)
