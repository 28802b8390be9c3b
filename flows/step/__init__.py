"""One RLHF step: the planner hook, the step flow, its action invocations and metrics."""
