"""Child scripts the run tests start as runs."""


def bad_metrics_lines() -> int:
    """How many bad lines ``bad_metrics.py`` writes."""
    import runpy
    from pathlib import Path

    path = Path(__file__).with_name("bad_metrics.py")
    return int(runpy.run_path(str(path), run_name="count")["COUNT"])
