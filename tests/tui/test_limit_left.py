"""The dashboard names a power limit a killed sweep left changed, and the command
that puts it back, as an alert on that GPU."""

from __future__ import annotations

import subprocess

from gpustation.control import lease

from .conftest import make_app, notifications, wait_for


async def test_a_limit_a_killed_sweep_left_is_an_alert_naming_the_restore() -> None:
    app, backend = make_app(count=2)
    uuid = backend.read_gpus([1], slow=False)[0].uuid
    gone = subprocess.Popen(["true"])
    gone.wait()
    left = lease.Lease(
        "20240101-000000-sweep-x",
        "sweep 20240101-000000-sweep-x",
        [(1, uuid)],
        simulated=True,
        restore="gpustation sweeps restore 20240101-000000-sweep-x",
        pid=gone.pid,
        start="1",
    )
    lease.take(left)
    want = (
        "GPU 1: limit left by sweep 20240101-000000-sweep-x; "
        "`gpustation sweeps restore 20240101-000000-sweep-x`"
    )
    async with app.run_test(size=(160, 48)) as pilot:
        await wait_for(pilot, lambda: app.passes >= 1)
        await wait_for(
            pilot,
            lambda: (
                [(a.gpu, a.message) for a in app.alerts.active if a.rule == "limit_left"]
                == [(1, want)]
            ),
        )
        await wait_for(pilot, lambda: any(want in n for n in notifications(app)))
        lease.release(left.id)  # restored
        app.sample_now()
        await wait_for(pilot, lambda: not any(a.rule == "limit_left" for a in app.alerts.active))
