"""Webhooks: subscriptions, the outbox every state change writes to, and delivery."""
