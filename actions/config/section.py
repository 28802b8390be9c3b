"""The base of every configuration section: unknown keys are errors, assignments validated,
and every float finite (``nan`` or ``inf`` in a weight, a timeout or a price is refused with the
field named, rather than failing later far from the config)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Section(BaseModel):
    """A config section that forbids unknown keys, so a typo names the key instead of being ignored."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)
