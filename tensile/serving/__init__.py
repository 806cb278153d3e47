"""What every tensile program serves with: TLS from files (reloaded) or bootstrapped, the
Prometheus metrics and health endpoints, signal handling and graceful shutdown, the
flag/duration helpers, and the one lifecycle every program's parts live by (`lifecycle`).
The virtual node, the webhook and the descheduler compose these parts; none of them owns
its own copy."""
