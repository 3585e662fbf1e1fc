"""The Prometheus endpoint and what it reads."""
