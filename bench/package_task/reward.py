"""The bench's reward in the package's contract: case-insensitive exact match, as Sandhive's
`exact` scorer judges the same rows (both sides must score every row 1.0)."""


def compute_score(agent_answer: str, ground_truth: str, **row: object) -> float:
    return float(agent_answer.strip().lower() == str(ground_truth).strip().lower())
