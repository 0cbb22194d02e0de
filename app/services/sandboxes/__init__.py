"""Sandboxes callers drive themselves (`/v1/sandboxes`): rows, the API's calls to their worker."""
