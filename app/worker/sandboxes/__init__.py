"""The worker's side of `/v1/sandboxes`: serve requests (`server`), run commands (`commands`),
keep deadlines and clean up after dead workers (`upkeep`)."""
