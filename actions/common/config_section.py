"""The base of every configuration section: unknown keys are errors, assignments validated."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Section(BaseModel):
    """A config section that forbids unknown keys, so a typo names the key instead of being ignored."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)
