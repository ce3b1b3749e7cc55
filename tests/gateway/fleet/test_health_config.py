"""A member's health on a fake clock (ejection, re-admission, slow start), what a failed attempt means, and
the configuration: the URL list, LiteLLM's model list, and what is refused."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
import yaml

from gateway.api.errors import InvalidRequest, ServiceUnavailable, UpstreamFailed
from gateway.fleet.config import FleetConfigError, fleet_config, parse_upstreams, read_upstreams_file
from gateway.fleet.failover import Failure, classify
from gateway.fleet.health import HealthPolicy, MemberHealth
from gateway.runtime.settings import Settings
from tests.gateway.traffic.test_breaker import FakeClock as Clock


def test_failures_in_a_row_eject_and_a_passing_check_brings_it_back_slowly() -> None:
    clock = Clock()
    health = MemberHealth("a", HealthPolicy(eject_failures=5, slow_start_s=10.0), clock=clock)
    for _ in range(20):
        health.record_success()
    for _ in range(4):
        health.record_failure()
    health.record_success()  # not in a row
    for _ in range(4):
        health.record_failure()
    assert health.state == "healthy"  # 8 failures in 29 calls: under the breaker's 50% too
    health.record_failure()
    assert health.state == "ejected" and health.ejections == 1
    assert health.describe()["ejected_for"] == "failures"
    health.check_passed()  # its breaker stayed closed: back at once, with slow start
    assert health.state == "slow_start" and health.warmth() == pytest.approx(0.1)
    clock.now += 5.0
    assert health.warmth() == pytest.approx(0.55)
    clock.now += 5.0
    assert health.state == "healthy" and health.warmth() == 1.0


def test_a_member_its_breaker_ejected_comes_back_only_after_the_cool_down() -> None:
    clock = Clock()
    health = MemberHealth("a", HealthPolicy(eject_failures=100, breaker_cooldown_s=2.0), clock=clock)
    for _ in range(5):
        health.record_success()
        health.record_failure()
    assert health.state == "ejected" and health.breaker.state.value == "open"  # 5 of 10: the rate
    health.check_passed()
    assert health.state == "ejected"  # the check is the half-open probe, after the cool-down only
    clock.now += 2.0
    health.check_passed()
    assert health.state == "slow_start" and health.breaker.state.value == "closed"


def test_failed_checks_in_a_row_eject_and_a_new_member_waits_for_its_first_check() -> None:
    clock = Clock()
    health = MemberHealth("a", HealthPolicy(unhealthy_checks=2), clock=clock)
    health.check_failed("ConnectError")
    assert health.routable
    health.check_failed("ConnectError")
    assert not health.routable and health.describe()["ejected_for"] == "checks"
    health.check_passed()
    assert health.state == "slow_start"
    joining = MemberHealth("b", HealthPolicy(), admitted=False, clock=clock)
    assert joining.describe()["ejected_for"] == "new"
    joining.admit_now()  # one the fleet started with: no slow start
    assert joining.state == "healthy"


def test_what_a_failed_attempt_means() -> None:
    request = httpx.Request("POST", "http://m.invalid/v1/chat/completions")

    def wrapped(error: Exception, status: int = 502) -> UpstreamFailed:
        failed = UpstreamFailed("x", status_code=status)
        failed.__cause__ = error
        return failed

    assert classify(wrapped(httpx.ConnectError("refused", request=request))) is Failure.NOT_SENT
    assert classify(wrapped(httpx.RemoteProtocolError("closed", request=request))) is Failure.NO_ANSWER
    assert classify(wrapped(httpx.ReadTimeout("slow", request=request), 504)) is Failure.TIMED_OUT
    assert classify(UpstreamFailed("busy", status_code=503)) is Failure.UNAVAILABLE
    assert classify(UpstreamFailed("slow down", status_code=429)) is Failure.RATE_LIMITED
    assert classify(UpstreamFailed("bug", status_code=500)) is Failure.SERVER_ERROR
    assert classify(InvalidRequest("bad")) is Failure.CLIENT_ERROR
    assert classify(ServiceUnavailable("down", code="engine_unavailable")) is Failure.NOT_SENT
    assert Failure.NOT_SENT.may_fail_over(stream=True)
    assert Failure.NO_ANSWER.may_fail_over(stream=False) and not Failure.NO_ANSWER.may_fail_over(stream=True)
    assert not Failure.TIMED_OUT.may_fail_over(stream=False) and not Failure.CLIENT_ERROR.members_fault


def test_one_url_is_no_fleet_and_several_are_one_pool() -> None:
    assert fleet_config(Settings(_env_file=None, upstream_url="http://a:8000/v1")) is None  # type: ignore[call-arg]
    settings = Settings(
        _env_file=None, upstream_url="http://a:8000/v1, http://b:8000/v1", upstream_models="x,y"
    )  # type: ignore[call-arg]
    config = fleet_config(settings)
    assert config is not None and len(config.pools) == 1
    pool = config.pools[0]
    assert pool.models == ("x", "y") and pool.routing == "prefix"
    assert [member.api_base for member in pool.members] == ["http://a:8000/v1", "http://b:8000/v1"]
    discovered = fleet_config(Settings(_env_file=None, upstream_url="dns+http://svc:8000/v1"))  # type: ignore[call-arg]
    assert discovered is not None and discovered.pools[0].members[0].discovered
    with pytest.raises(ValueError):
        Settings(_env_file=None, upstream_url="http://a:8000/v1,ftp://b")  # type: ignore[call-arg]


def test_a_litellm_model_list_becomes_pools(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PROVIDER_KEY", "sk-secret")
    path = tmp_path / "upstreams.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "model_list": [
                    {
                        "model_name": "gpt-4o",
                        "litellm_params": {
                            "model": "openai/gpt-4o",
                            "api_base": "https://api.example.com/v1",
                            "api_key": "os.environ/PROVIDER_KEY",
                        },
                        "model_info": {"id": "ignored"},
                    },
                    {
                        "model_name": "llama",
                        "litellm_params": {
                            "model": "hosted_vllm/meta/llama",
                            "api_base": "http://v0:8000/v1",
                            "weight": 99,
                        },
                    },
                    {
                        "model_name": "llama",
                        "litellm_params": {"model": "meta/llama", "api_base": "http://v1:8000/v1/"},
                        "weight": 1,
                        "canary": True,
                    },
                    {
                        "model_name": "llama",
                        "litellm_params": {"api_base": "http://next:8000/v1"},
                        "shadow": True,
                        "routing": "least-busy",
                    },
                ],
                "router_settings": {"routing_strategy": "round-robin"},
            }
        )
    )
    config = read_upstreams_file(path, "prefix")
    gpt, llama = config.pools
    assert (gpt.name, gpt.models, gpt.routing) == ("gpt-4o", ("gpt-4o",), "round-robin")
    assert gpt.members[0].model == "gpt-4o" and gpt.members[0].api_key == "sk-secret"
    assert llama.routing == "least-loaded"
    assert [(m.model, m.weight, m.canary, m.shadow) for m in llama.members] == [
        ("meta/llama", 99.0, False, False),
        ("meta/llama", 1.0, True, False),
        (None, 1.0, False, True),
    ]
    assert llama.members[1].api_base == "http://v1:8000/v1"


@pytest.mark.parametrize(
    ("document", "complaint"),
    [
        ({"models": []}, "model_list"),
        ({"model_list": []}, "empty"),
        ({"model_list": [{"litellm_params": {"api_base": "http://a"}}]}, "model_name"),
        ({"model_list": [{"model_name": "m", "litellm_params": {"api_base": "ftp://a"}}]}, "api_base"),
        (
            {"model_list": [{"model_name": "m", "litellm_params": {"api_base": "http://a"}, "weight": 0}]},
            "weight",
        ),
        (
            {"model_list": [{"model_name": "m", "litellm_params": {"api_base": "http://a"}, "shadow": True}]},
            "shadow",
        ),
        (
            {
                "model_list": [
                    {
                        "model_name": "m",
                        "litellm_params": {"api_base": "http://a", "api_key": "os.environ/NOPE_NOT_SET"},
                    }
                ]
            },
            "NOPE_NOT_SET",
        ),
        (
            {
                "model_list": [
                    {"model_name": "m", "litellm_params": {"api_base": "http://a"}, "routing": "random"}
                ]
            },
            "random",
        ),
    ],
)
def test_a_file_that_cannot_work_is_refused(document: object, complaint: str) -> None:
    with pytest.raises(FleetConfigError, match=complaint):
        parse_upstreams(document, "upstreams.yaml", "prefix")
