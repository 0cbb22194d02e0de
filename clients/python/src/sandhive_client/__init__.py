"""Python client of the Sandhive API.

from sandhive_client import Sandhive

with Sandhive("http://127.0.0.1:8000", api_key="sk_...") as sandhive:
    task = sandhive.tasks.create("What is 2 + 2?")
    for event in sandhive.tasks.stream(task.id):
        print(event.seq, event.type)
    print(sandhive.tasks.wait(task.id).answer)
"""

from sandhive_client._http import Retries
from sandhive_client._version import __version__
from sandhive_client.aio import AsyncSandhive
from sandhive_client.client import Sandhive
from sandhive_client.errors import (
    APIError,
    BadRequest,
    Conflict,
    ConnectionFailed,
    InvalidInput,
    NotFound,
    RateLimited,
    RetryableError,
    SandhiveError,
    ServerError,
    TooLarge,
    Unauthorized,
    Unavailable,
    WaitTimeout,
    WebhookVerificationError,
)
from sandhive_client.models import (
    Artifact,
    ArtifactList,
    BatchResult,
    Event,
    Experiment,
    ExperimentItem,
    ExperimentPage,
    Step,
    Task,
    TaskPage,
    Trajectory,
)
from sandhive_client.webhooks import verify_webhook

__all__ = [
    "APIError",
    "Artifact",
    "ArtifactList",
    "AsyncSandhive",
    "BadRequest",
    "BatchResult",
    "Conflict",
    "ConnectionFailed",
    "Event",
    "Experiment",
    "ExperimentItem",
    "ExperimentPage",
    "InvalidInput",
    "NotFound",
    "RateLimited",
    "Retries",
    "RetryableError",
    "Sandhive",
    "SandhiveError",
    "ServerError",
    "Step",
    "Task",
    "TaskPage",
    "TooLarge",
    "Trajectory",
    "Unauthorized",
    "Unavailable",
    "WaitTimeout",
    "WebhookVerificationError",
    "__version__",
    "verify_webhook",
]
