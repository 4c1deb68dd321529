"""Schemathesis against the service's own OpenAPI: no generated request may get a 5xx.

Not collected by ``make test`` directly (the name does not start with ``test_``):
``tests/test_service_process.py`` runs it in a child process under a 4 GiB address-space limit, so a request
that made the server allocate without bound fails the run instead of the machine. Examples are bounded
(``MAX_EXAMPLES`` per operation) so the run takes about a minute.
"""

from __future__ import annotations

import os

import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error

from frenzy_opt.api.app import ServiceConfig, create_app
from frenzy_opt.launch.executors.simulated import SimulatedExecutor
from frenzy_opt.planning.scenario import load_cluster_ref

MAX_EXAMPLES = 12

app = create_app(
    ServiceConfig(
        cluster=load_cluster_ref("paper-3type"),
        db_url=os.environ.get("FRENZY_FUZZ_DB", "sqlite:///fuzz.db"),
        executor=SimulatedExecutor(time_scale=1e9),
        time_scale=1e9,
        decision_wait_s=0.05,
    )
)
app.state.service.orchestrator.start()  # schemathesis calls the ASGI app without its lifespan
schema = schemathesis.openapi.from_asgi("/openapi.json", app)


@schema.parametrize()
@settings(max_examples=MAX_EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
def test_no_server_error(case: schemathesis.Case) -> None:
    case.call_and_validate(checks=[not_a_server_error])
