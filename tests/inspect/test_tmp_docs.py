from pathlib import Path
from app.config import Settings
from tests.e2e.test_doc_examples import bare, make_run, reader, run_example, run_here, examples  # noqa: F401
from tests.support.processes import Service


def test_inspect_page(make_run: Service, bare: Settings, reader: dict[str, str], tmp_path: Path) -> None:
    mine = [e for e in examples() if e.page == "docs/inspect.md"]
    print([str(e) for e in mine], [str(e) for e in run_here() if e.page == "docs/inspect.md"])
    failed = []
    for n, example in enumerate(mine):
        problem = run_example(example, make_run.base_url, bare, reader, "127.0.0.1:1", tmp_path / str(n))
        print(example, problem or "works")
        if problem:
            failed.append(problem)
    assert not failed, "\n\n".join(failed)
