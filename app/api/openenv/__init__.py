"""`/v1/openenv`: episodes served to OpenEnv's clients (its WebSocket session protocol)."""
