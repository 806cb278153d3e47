"""What every tensile program serves with: TLS from files (reloaded) or bootstrapped, the
Prometheus metrics and health endpoints, signal handling and graceful shutdown, the
flag/duration helpers, and the one lifecycle every program's parts live by (`lifecycle`).
Every program composes these parts; none owns its own copy. A program that runs (the
virtual node, the webhook, the descheduler, the scheduler extender) is a list of
`lifecycle.Component`s run by one `lifecycle.Runner`, so start order, readiness, SIGTERM
and the drain are one mechanism."""
