"""The campaign around the steps: set-up, the step loop, commits, leases, garbage collection, observability."""
