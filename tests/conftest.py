from pathlib import Path

import pytest

# the shipped conformance suite's asserts explain themselves like a test file's
pytest.register_assert_rewrite("tuner.testing.conformance")

ROOT = Path(__file__).resolve().parent.parent
SHARED = ROOT.parent / "shared"
FIXTURES = ROOT / "tests" / "fixtures"


@pytest.fixture(scope="session")
def shared_dir() -> Path:
    if not SHARED.exists():
        pytest.skip(f"{SHARED} (the project's shared data) is not beside the checkout")
    return SHARED


@pytest.fixture(scope="session")
def vllm_fixtures(shared_dir) -> Path:
    return shared_dir / "fixtures" / "vllm-0.32-cpu"
