"""Python client of the Sandhive API.

from sandhive_client import Sandhive

with Sandhive("http://127.0.0.1:8000", api_key="sk_...") as sandhive:
    task = sandhive.tasks.create("What is 2 + 2?")
    for event in sandhive.tasks.stream(task.id):
        print(event.seq, event.type)
    print(sandhive.tasks.wait(task.id).answer)

    with sandhive.sandboxes.create(ttl_s=300) as sandbox:   # deleted at the end
        print(sandbox.exec(["python3", "-c", "print(6 * 7)"]).stdout_text)
"""

from sandhive_client._http import Retries
from sandhive_client._version import __version__
from sandhive_client.aio import AsyncSandbox, AsyncSandhive
from sandhive_client.client import Sandbox, Sandhive
from sandhive_client.errors import (
    APIError,
    BadRequest,
    CommandStreamError,
    Conflict,
    ConnectionFailed,
    Forbidden,
    ImageBuildFailed,
    InvalidInput,
    NotFound,
    RateLimited,
    RetryableError,
    SandboxFileError,
    SandboxFileNotFound,
    SandboxFileTooLarge,
    SandboxIsADirectory,
    SandboxPermissionError,
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
    Command,
    CommandPage,
    Event,
    ExecOutput,
    ExecResult,
    Experiment,
    ExperimentItem,
    ExperimentPage,
    FileEntry,
    FileList,
    FileWritten,
    Image,
    ImageBuild,
    ImageResources,
    SandboxInfo,
    SandboxPage,
    Step,
    Task,
    TaskFork,
    TaskPage,
    Trajectory,
)
from sandhive_client.webhooks import verify_webhook

__all__ = [
    "APIError",
    "Artifact",
    "ArtifactList",
    "AsyncSandbox",
    "AsyncSandhive",
    "BadRequest",
    "BatchResult",
    "Command",
    "CommandPage",
    "CommandStreamError",
    "Conflict",
    "ConnectionFailed",
    "Event",
    "ExecOutput",
    "ExecResult",
    "Experiment",
    "ExperimentItem",
    "ExperimentPage",
    "FileEntry",
    "FileList",
    "FileWritten",
    "Forbidden",
    "Image",
    "ImageBuild",
    "ImageBuildFailed",
    "ImageResources",
    "InvalidInput",
    "NotFound",
    "RateLimited",
    "Retries",
    "RetryableError",
    "Sandbox",
    "SandboxFileError",
    "SandboxFileNotFound",
    "SandboxFileTooLarge",
    "SandboxInfo",
    "SandboxIsADirectory",
    "SandboxPage",
    "SandboxPermissionError",
    "Sandhive",
    "SandhiveError",
    "ServerError",
    "Step",
    "Task",
    "TaskFork",
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
