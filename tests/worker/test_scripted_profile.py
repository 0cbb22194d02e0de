"""The built-in `scripted` profile end to end: submitted, run by a real worker, finished.

`serving` is what `sandhive worker` enters (app/cli/main.py): the profile's server runs in the
worker's process, so a task that names `llm.profile = "scripted"` needs nothing else.
"""

from __future__ import annotations

from redis.asyncio import Redis

from app.config import Settings
from app.db.engine import Sessions
from app.schemas.tasks import LLMOptions, TaskCreate
from app.scripted import DEMO_ANSWER
from app.scripted.profile import TOUR_ANSWER, TOUR_IMAGE, serving
from app.services.tasks import artifacts
from app.services.tasks import service as tasks
from app.worker.pool import Worker

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


async def test_the_scripted_profile_runs_demo_and_tour_in_a_real_worker(
    settings: Settings, redis: Redis, sessions: Sessions
) -> None:
    on = settings.model_copy(update={"scripted_profile": True, "llm_base_url": ""})
    with serving(on) as served:
        assert served.scripted_base_url.startswith("http://127.0.0.1:")
        ids = {}
        for model in ("demo", "tour"):
            body = TaskCreate(prompt="anything", llm=LLMOptions(profile="scripted", model=model))
            created, _ = await tasks.submit_task(sessions, redis, on, "default", body, None)
            ids[model] = created.id
        await Worker(served).run(burst=True)
    demo, tour = [await tasks.get_task(sessions, "default", ids[m]) for m in ("demo", "tour")]
    assert (demo.status, demo.finish_reason, demo.answer) == ("succeeded", "submitted", DEMO_ANSWER)
    assert (tour.status, tour.finish_reason, tour.answer) == ("succeeded", "submitted", TOUR_ANSWER)
    steps = (await tasks.get_trajectory(sessions, "default", ids["tour"])).steps
    assert len(steps) == 9
    assert all("Scripted tour, not a real model" in s.thought for s in steps), "labelled"
    assert "NameError" in steps[2].observation, "a failing command"
    assert steps[2].exit_code != 0
    assert steps[3].action is not None
    assert steps[3].action.arguments["command"] == "str_replace", "an edit"
    assert "checked  8000 starts" in steps[4].observation, "the live output, kept"
    listed = await artifacts.list_artifacts(sessions, "default", ids["tour"])
    image = next(a for a in listed.items if a.path == TOUR_IMAGE)
    assert image.content_type == "image/png"
    _, data = await artifacts.read_artifact(sessions, "default", ids["tour"], TOUR_IMAGE)
    assert data[:8] == PNG_MAGIC


def test_serving_leaves_settings_alone_when_the_profile_is_off_or_served_elsewhere(
    settings: Settings,
) -> None:
    with serving(settings) as same:
        assert same is settings
    elsewhere = settings.model_copy(
        update={"scripted_profile": True, "scripted_base_url": "http://127.0.0.1:9/v1"}
    )
    with serving(elsewhere) as same:
        assert same is elsewhere
