"""``python -m actions.tasks.rewards.check [NAME ...]``: can this environment score?

Run when an action image is built (runtime_images/*/Dockerfile), so an image that lacks a
reward's dependency, or a user's reward module, fails its build instead of its first score
action. Every built-in reward is loaded and called once on a one-row sample (which imports
what it needs on use, e.g. ``math-verify`` for ``math``); each ``package.module:function``
NAME is imported and checked to be callable (plug-ins are not called: their columns are the
user's). Prints one line per reward; exits 1 with one line naming the first failure.
"""

from __future__ import annotations

import sys

from actions.config.reward import BUILTIN_REWARDS
from actions.tasks.rewards import RewardFunctionError, load_reward

SAMPLE = {"prompts": ["What is 1 + 1?"], "completions": ["1 + 1 = 2\n#### 2"], "answer": ["2"]}
"""One row in the form every built-in accepts (TRL's keywords)."""


def check(names: list[str]) -> list[str]:
    """The built-ins plus ``names``, each loaded (and built-ins called once); returns one
    report line per reward. Raises RewardFunctionError naming the first that fails."""
    lines = []
    for name in BUILTIN_REWARDS:
        try:
            value = load_reward(name)(**SAMPLE)
        except Exception as exc:  # a missing dependency surfaces here as ImportError
            raise RewardFunctionError(f"built-in reward {name!r} cannot run in this environment "
                                      f"({type(exc).__name__}: {exc}); install its dependencies") from None
        lines.append(f"built-in {name}: ok (sample reward {value[0]})")
    for name in names:
        if ":" not in name:
            raise RewardFunctionError(f"reward {name!r}: name a plug-in as package.module:function")
        load_reward(name)
        lines.append(f"plug-in {name}: ok")
    return lines


def main(argv: list[str] | None = None) -> int:
    names = [n for arg in (sys.argv[1:] if argv is None else argv) for n in arg.replace(",", " ").split()]
    try:
        lines = check(names)
    except RewardFunctionError as exc:
        print(f"rewards: {exc}", file=sys.stderr)
        return 1
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
