"""Optional TensorBoard event files: every committed step's metrics as scalars.

With ``observability.tensorboard: true`` the campaign writes one scalar per metric of
flows/step/metrics.py (``reward/mean``, ``timing_s/generate``, ``cost/usd``, ...), and under TRL's
name too where TRL logs it under another (``reward``, ``completions/*``:
``TRL_NAMES``), at global step = steps committed, plus each evaluation's ``eval/accuracy``, ``eval/reward_mean``,
``eval/mean_length`` and ``eval/reward_fn/<name>`` at the step it was measured (0 = before RL), into
``runs/<run_id>/tensorboard/`` (``tensorboard --logdir runs``). A resumed campaign appends a
new event file to the same directory; TensorBoard merges them.

Writing uses tensorboardX (protobuf + numpy, no TensorFlow; ``torch.utils.tensorboard`` needs
the whole ``tensorboard`` package). ``read_scalars`` reads the files back with tensorboardX's
own protobuf classes and checks every record's CRC, so tests and scripts need no TensorBoard.
"""

from __future__ import annotations

import importlib.util
import math
import struct
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from flows.config import CampaignConfig

if TYPE_CHECKING:
    from flows.campaign.state import EvalRecord

NON_SCALAR_KEYS = ("plan", "step")
"""Entries of a step's metrics that are not TensorBoard scalars (the planner's record, the index)."""
TRL_NAMES = {
    "reward/mean": "reward", "response_length/mean": "completions/mean_length",
    "response_length/max": "completions/max_length", "response_length/min": "completions/min_length",
    "response_length/clip_ratio": "completions/clipped_ratio",
}
"""Campaign metric -> the name TRL's GRPOTrainer logs it under, where they differ (``kl``,
``grad_norm``, ``loss`` (GRPO's, the KL term included), ``entropy``, ``reward_std`` and
``frac_reward_zero_std`` are already TRL's, the last two for the run's ``algorithm.std_scope`` as
TRL's ``scale_rewards``; ``reward/std``, the std of all the step's rewards, is not TRL's
``reward_std``: ``actions/rl/batch.py``, ``rollout_metrics``)."""


def step_scalars(metrics: dict[str, Any]) -> dict[str, float]:
    """A step's finite numeric metrics under their own names plus TRL's (``TRL_NAMES``): what
    every tracker logs of a step (``trackers.py``), this board included.

    >>> step_scalars({"reward/mean": 0.5, "plan": {}, "kl": 0.01, "x": float("nan")})
    {'kl': 0.01, 'reward': 0.5, 'reward/mean': 0.5}
    """
    out = {k: float(v) for k, v in metrics.items() if k not in NON_SCALAR_KEYS and isinstance(v, (int, float))
           and not isinstance(v, bool) and math.isfinite(v)}
    out.update({TRL_NAMES[k]: v for k, v in list(out.items()) if k in TRL_NAMES})
    return dict(sorted(out.items()))


def board_dir(cfg: CampaignConfig, run_id: str) -> Path:
    return Path(cfg.observability.tensorboard_dir or f"runs/{run_id}/tensorboard")


def check_tensorboard(cfg: CampaignConfig) -> None:
    """Raise ValueError when ``observability.tensorboard`` is on and tensorboardX is missing
    (a pre-flight check: it reads nothing and writes nothing)."""
    if cfg.observability.tensorboard and importlib.util.find_spec("tensorboardX") is None:
        raise ValueError("observability.tensorboard=true needs the tensorboardX package; install it with "
                         "pip install 'rlhfless[tensorboard]' or set observability.tensorboard=false")


class ScalarBoard:
    """Writes a campaign's step metrics; a disabled board (the default) does nothing."""

    def __init__(self, writer: Any = None) -> None:
        self._writer = writer

    @classmethod
    def open(cls, cfg: CampaignConfig, run_id: str) -> ScalarBoard:
        """A board for ``cfg``; raises ValueError when enabled without tensorboardX installed."""
        check_tensorboard(cfg)
        if not cfg.observability.tensorboard:
            return cls()
        from tensorboardX import SummaryWriter

        path = board_dir(cfg, run_id)
        path.mkdir(parents=True, exist_ok=True)
        return cls(SummaryWriter(logdir=str(path), flush_secs=30))

    @property
    def enabled(self) -> bool:
        return self._writer is not None

    def add_step(self, step: int, metrics: dict[str, Any], evals: Sequence[EvalRecord]) -> None:
        """Write the metrics of the step that made ``step`` steps committed, and the evaluation
        measured at that step (with step 1 also the pre-RL evaluation, at step 0)."""
        if self._writer is None:
            return
        for name, value in step_scalars(metrics).items():
            self._writer.add_scalar(name, value, global_step=step)
        for ev in evals:
            if ev.step == step or (step == 1 and ev.step == 0):
                for name, value in ev.scalars().items():
                    self._writer.add_scalar(name, float(value), global_step=ev.step)
        self._writer.flush()  # visible to a running TensorBoard at once, not after flush_secs

    def close(self, end: Any = None) -> None:
        """Close the event file; ``end`` (how the campaign ended, ``trackers.RunEnd``) changes
        nothing: event files have no run status."""
        if self._writer is not None:
            self._writer.close()
            self._writer = None


def read_scalars(logdir: str | Path) -> dict[str, list[tuple[int, float]]]:
    """All scalars of the event files in ``logdir``: tag -> [(step, value)], file order.

    Raises:
        ValueError: a record whose length or data checksum does not match (a torn file).
    """
    from tensorboardX.proto.event_pb2 import Event
    from tensorboardX.record_writer import masked_crc32c

    out: dict[str, list[tuple[int, float]]] = {}
    for path in sorted(Path(logdir).glob("events.out.tfevents.*")):
        data, pos = path.read_bytes(), 0
        # TFRecord framing: u64 length, u32 masked CRC of the length, data, u32 masked CRC of data.
        while pos + 12 <= len(data):
            header = data[pos:pos + 8]
            (length,) = struct.unpack("<Q", header)
            payload = data[pos + 12:pos + 12 + length]
            crcs = (struct.unpack("<I", data[pos + 8:pos + 12])[0],
                    struct.unpack("<I", data[pos + 12 + length:pos + 16 + length] or b"\0\0\0\0")[0])
            if crcs != (masked_crc32c(header), masked_crc32c(payload)):
                raise ValueError(f"{path}: corrupt record at byte {pos}")
            pos += 16 + length
            event = Event.FromString(payload)
            for value in event.summary.value:
                if value.HasField("simple_value"):
                    out.setdefault(value.tag, []).append((int(event.step), float(value.simple_value)))
    return out
