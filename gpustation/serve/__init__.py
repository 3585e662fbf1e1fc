"""The Prometheus endpoint and what it reads; the dashboard served to a browser (web.py)."""
