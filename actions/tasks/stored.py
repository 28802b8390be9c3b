"""A stored dataset's prompt rows as actions read them, cached while the container is warm.

The dataset is an artifact (``actions/prepare.py`` writes it) holding one file,
:data:`~actions.tasks.dataset.DATASET_FILE`, in the format of :mod:`actions.tasks.dataset`.
A dataset key never changes once its manifest exists, so a warm hit is always valid.
"""

from __future__ import annotations

from actions.models import warm
from actions.models.loading import store_for
from actions.store import get_artifact
from actions.tasks.dataset import DATASET_FILE, PromptRow, parse_jsonl


def load_dataset(store_uri: str, dataset_key: str) -> dict[int, PromptRow]:
    """Every row of the dataset at ``dataset_key``, by prompt id."""
    def build() -> dict[int, PromptRow]:
        files, _ = get_artifact(store_for(store_uri), dataset_key, [DATASET_FILE])
        return {r.prompt_id: r for r in parse_jsonl(files[DATASET_FILE], source=dataset_key)}

    return warm.get_or_build(("dataset", store_uri, dataset_key), build)[0]


def rows_for(dataset: dict[int, PromptRow], prompt_ids: list[int]) -> list[PromptRow]:
    """The rows of ``prompt_ids``, in that order; ValueError naming the ids not in the dataset."""
    missing = [p for p in prompt_ids if p not in dataset]
    if missing:
        raise ValueError(f"prompt_ids {missing[:5]} are not in the dataset")
    return [dataset[p] for p in prompt_ids]
