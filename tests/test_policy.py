"""DevicePolicy: validation, the RLX_* environment, sources, and refusals with reasons."""

from __future__ import annotations

import dataclasses

import pytest

from rlx_core.errors import ConfigError
from rlx_core.placement.policy import DevicePolicy
from rlx_core.run.settings import environment_settings

DEFAULT_SOURCES = dict.fromkeys(
    ("allow", "deny", "prefer", "pick", "benchmark_runs", "device", "chain", "strict"), "default")


def test_defaults():
    policy = DevicePolicy()
    assert (policy.allow, policy.deny, policy.prefer, policy.pick, policy.benchmark_runs, policy.device,
            policy.chain, policy.strict) == (None, (), (), "cost", 3, None, (), False)
    assert dict(policy.sources) == DEFAULT_SOURCES
    assert policy.permits("cuda:3") is None


def test_arguments_are_normalized_and_recorded_as_such():
    policy = DevicePolicy(allow=[" cpu", "jax ", "", "cpu"], deny="cuda, opencl", prefer=iter(["jax"]),
                          device=" cuda:1 ", chain=("cuda", "cpu"), strict=1)
    assert policy.allow == ("cpu", "jax") and policy.deny == ("cuda", "opencl") and policy.prefer == ("jax",)
    assert policy.device == "cuda:1" and policy.chain == ("cuda", "cpu") and policy.strict is True
    assert policy.sources["allow"] == "argument" and policy.sources["pick"] == "default"
    assert policy == DevicePolicy(allow=("cpu", "jax"), deny=("cuda", "opencl"), prefer=("jax",), device="cuda:1",
                                  chain=("cuda", "cpu"), strict=True)
    assert hash(policy) == hash(dataclasses.replace(policy))
    assert "sources" not in repr(policy)


@pytest.mark.parametrize(("kwargs", "needle"), [
    ({"pick": "fastest"}, "pick: 'fastest' is not one of cost, benchmark"),
    ({"benchmark_runs": 0}, "benchmark_runs: 0"),
    ({"benchmark_runs": 2.5}, "benchmark_runs: 2.5"),
    ({"benchmark_runs": True}, "benchmark_runs: True"),
    ({"device": ""}, "device: ''"),
    ({"device": "cuda:x"}, "device: 'cuda:x'"),
    ({"deny": ["cu da"]}, "deny: 'cu da'"),
    ({"allow": [3]}, "allow: 3"),
    ({"prefer": 5}, "prefer: expected an iterable"),
    ({"strict": "yes"}, "strict: 'yes'"),
])
def test_invalid_arguments_are_config_errors(kwargs, needle):
    with pytest.raises(ConfigError) as exc:
        DevicePolicy(**kwargs)
    assert needle in str(exc.value)


def test_pickles_and_copies_with_its_sources():
    import copy
    import pickle

    policy = DevicePolicy.from_env(environ={"RLX_DENY_DEVICES": "cuda", "RLX_STRICT": "1"})
    for clone in (pickle.loads(pickle.dumps(policy)), copy.deepcopy(policy), copy.copy(policy)):
        assert clone == policy and dict(clone.sources) == dict(policy.sources)


def test_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        DevicePolicy().deny = ("cuda",)  # type: ignore[misc]


# -- builders ----------------------------------------------------------------------


def test_only_works_on_the_class_and_on_an_instance():
    from_class = DevicePolicy.only(["cpu", "jax"])
    assert from_class.allow == ("cpu", "jax") and from_class.sources["allow"] == "argument"
    base = DevicePolicy(deny=("cuda",))
    narrowed = base.only(["cpu"])
    assert narrowed.allow == ("cpu",) and narrowed.deny == ("cuda",)
    assert base.allow is None  # never mutated
    assert DevicePolicy.only.__doc__ and "Allow exactly" in DevicePolicy.only.__doc__


def test_with_builders_return_new_policies():
    base = DevicePolicy.from_env(environ={"RLX_DENY_DEVICES": "opencl"})
    p = base.with_deny(["cuda"]).with_prefer(["jax", "cpu"]).with_benchmark_pick(5)
    assert (p.deny, p.prefer, p.pick, p.benchmark_runs) == (("cuda",), ("jax", "cpu"), "benchmark", 5)
    assert p.sources["deny"] == "argument" and p.sources["benchmark_runs"] == "argument"
    assert base.deny == ("opencl",) and base.pick == "cost" and base.sources["deny"] == "env RLX_DENY_DEVICES"
    assert DevicePolicy.with_deny(["tpu"]).deny == ("tpu",)
    with pytest.raises(ConfigError, match="benchmark_runs: 0"):
        base.with_benchmark_pick(0)
    with pytest.raises(ConfigError, match="with_deny: 'cuda:x'"):
        base.with_deny(["cuda:x"])


# -- environment -------------------------------------------------------------------


def test_from_env_reads_every_variable_and_records_sources():
    env = {
        "RLX_DEVICE": " cuda:1 ",
        "RLX_DEVICES": "cpu, cuda , jax,cpu",
        "RLX_DENY_DEVICES": "opencl",
        "RLX_PREFER_DEVICES": "jax,cpu",
        "RLX_DEVICE_CHAIN": "cuda,cpu",
        "RLX_BENCHMARK_PICK": "4",
        "RLX_STRICT": "Yes",
    }
    policy = DevicePolicy.from_env(environ=env)
    assert policy == DevicePolicy(allow=("cpu", "cuda", "jax"), deny=("opencl",), prefer=("jax", "cpu"),
                                  pick="benchmark", benchmark_runs=4, device="cuda:1", chain=("cuda", "cpu"),
                                  strict=True)
    assert dict(policy.sources) == {
        "allow": "env RLX_DEVICES", "deny": "env RLX_DENY_DEVICES", "prefer": "env RLX_PREFER_DEVICES",
        "pick": "env RLX_BENCHMARK_PICK", "benchmark_runs": "env RLX_BENCHMARK_PICK", "device": "env RLX_DEVICE",
        "chain": "env RLX_DEVICE_CHAIN", "strict": "env RLX_STRICT",
    }


def test_from_env_empty_or_unset_means_default():
    policy = DevicePolicy.from_env(environ={"RLX_DEVICES": "  ", "RLX_DEVICE": "", "RLX_STRICT": " "})
    assert policy == DevicePolicy() and dict(policy.sources) == DEFAULT_SOURCES


@pytest.mark.parametrize("var", ["RLX_DEVICES", "RLX_DENY_DEVICES", "RLX_PREFER_DEVICES", "RLX_DEVICE_CHAIN"])
@pytest.mark.parametrize("value", ["cpu,,", "cpu,", ",cpu", "cpu, ,jax", " , "])
def test_an_empty_entry_is_a_config_error_naming_variable_and_value(var, value):
    # ``RLX_DEVICES=cpu,$EXTRA`` with EXTRA unset: ignoring the hole would hide the mistake
    with pytest.raises(ConfigError) as exc:
        DevicePolicy.from_env(environ={var: value})
    message = str(exc.value)
    assert message.startswith(f"{var}: {value.strip()!r}") and "empty entry" in message


def test_from_env_uses_the_prefix_and_defaults_to_os_environ(monkeypatch):
    monkeypatch.setenv("RLX_DENY_DEVICES", "tpu")
    assert DevicePolicy.from_env().deny == ("tpu",)
    assert DevicePolicy.from_env("MYAPP", {"MYAPP_DENY_DEVICES": "cuda", "RLX_DENY_DEVICES": "x"}).deny == ("cuda",)
    assert DevicePolicy.from_env("MYAPP", {"MYAPP_DENY_DEVICES": "cuda"}).sources["deny"] == "env MYAPP_DENY_DEVICES"


@pytest.mark.parametrize(("value", "pick", "runs"), [("0", "cost", 3), ("1", "benchmark", 1), (" 7 ", "benchmark", 7)])
def test_benchmark_pick(value, pick, runs):
    policy = DevicePolicy.from_env(environ={"RLX_BENCHMARK_PICK": value})
    assert (policy.pick, policy.benchmark_runs) == (pick, runs)
    assert policy.sources["pick"] == "env RLX_BENCHMARK_PICK"


@pytest.mark.parametrize(("value", "strict"), [("1", True), ("0", False), ("TRUE", True), ("no", False),
                                               ("on", True), ("False", False)])
def test_strict(value, strict):
    assert DevicePolicy.from_env(environ={"RLX_STRICT": value}).strict is strict


@pytest.mark.parametrize(("var", "value", "token"), [
    ("RLX_BENCHMARK_PICK", "abc", "abc"),
    ("RLX_BENCHMARK_PICK", "-1", "-1"),
    ("RLX_BENCHMARK_PICK", "2.5", "2.5"),
    ("RLX_STRICT", "maybe", "maybe"),
    ("RLX_STRICT", "2", "2"),
    ("RLX_DEVICE", "cu da", "cu da"),
    ("RLX_DEVICE", "cuda:x", "cuda:x"),
    ("RLX_DEVICES", "cpu, cu da", "cu da"),
    ("RLX_DENY_DEVICES", "cuda:x", "cuda:x"),
    ("RLX_PREFER_DEVICES", ":1", ":1"),
    ("RLX_DEVICE_CHAIN", "cpu,cuda:1:2", "cuda:1:2"),
])
def test_malformed_environment_is_a_config_error_naming_variable_and_token(var, value, token):
    with pytest.raises(ConfigError) as exc:
        DevicePolicy.from_env(environ={var: value})
    message = str(exc.value)
    assert message.startswith(f"{var}: ") and repr(token) in message


def test_environment_settings_lists_every_variable_with_its_value():
    settings = environment_settings(environ={"RLX_DEVICE": "cpu", "RLX_PROBE_TIMEOUT": "3"})
    names = [name for name, _, _ in settings]
    assert names == ["RLX_DEVICE", "RLX_DEVICES", "RLX_DENY_DEVICES", "RLX_PREFER_DEVICES", "RLX_DEVICE_CHAIN",
                     "RLX_BENCHMARK_PICK", "RLX_STRICT", "RLX_PROBE_TIMEOUT", "RLX_DISABLE_PLUGINS",
                     "RLX_CACHE_DIR", "RLX_FUSION_REPORT", "RLX_MEMORY_LIMIT", "RLX_REPICK_DRIFT",
                     "RLX_REPICK_FORGET", "RLX_ISOLATION", "RLX_CALIBRATE_TIMEOUT"]
    values = {name: value for name, value, _ in settings}
    assert values["RLX_DEVICE"] == "cpu" and values["RLX_PROBE_TIMEOUT"] == "3" and values["RLX_STRICT"] is None
    assert all(meaning and "\n" not in meaning for _, _, meaning in settings)
    assert environment_settings("X", {})[0] == ("X_DEVICE", None, settings[0][2])


# -- permits -----------------------------------------------------------------------


def test_permits_explains_refusals_with_their_source():
    from_env = DevicePolicy.from_env(environ={"RLX_DEVICES": "cpu,jax", "RLX_DENY_DEVICES": "cuda"})
    assert from_env.permits("cpu") is None
    assert from_env.permits("cuda") == "denied by policy (RLX_DENY_DEVICES)"
    assert from_env.permits("cuda:1") == "denied by policy (RLX_DENY_DEVICES)"
    assert from_env.permits("tpu") == "not in the allowed devices cpu, jax (RLX_DEVICES)"
    by_argument = DevicePolicy(allow=("cpu",), deny=("jax",))
    assert by_argument.permits("jax") == "denied by policy (DevicePolicy.deny)"
    assert by_argument.permits("tpu") == "not in the allowed devices cpu (DevicePolicy.allow)"
    assert DevicePolicy.only([]).permits("cpu") == "not in the allowed devices (none) (DevicePolicy.allow)"


def test_permits_device_indices():
    policy = DevicePolicy(deny=("cuda:1",), allow=("cuda", "tpu:0"))
    assert policy.permits("cuda:1") is not None
    assert policy.permits("cuda:0") is None and policy.permits("cuda") is None  # only index 1 is denied
    assert policy.permits("tpu:0") is None and policy.permits("tpu") is None  # the backend itself may be used
    assert policy.permits("tpu:1") == "not in the allowed devices cuda, tpu:0 (DevicePolicy.allow)"
    with pytest.raises(ConfigError, match="'cuda:x'"):
        policy.permits("cuda:x")


def test_to_dict_is_json_ready():
    d = DevicePolicy.from_env(environ={"RLX_DEVICES": "cpu"}).to_dict()
    assert d["allow"] == ["cpu"] and d["deny"] == [] and d["device"] is None
    assert d["sources"]["allow"] == "env RLX_DEVICES"


# -- validate: names against a registry ----------------------------------------------


def _toys():
    from support import ToyBackend, registry_with

    return registry_with(ToyBackend("toy"), ToyBackend("fast", priority=20))


@pytest.mark.parametrize(("var", "value", "name"), [
    ("RLX_DENY_DEVICES", "foo", "foo"),
    ("RLX_DEVICES", "toy,nonsense", "nonsense"),
    ("RLX_PREFER_DEVICES", "fast,bar:1", "bar"),
    ("RLX_DEVICE_CHAIN", "toy,zz", "zz"),
    ("RLX_DEVICE", "zz:0", "zz"),
])
def test_an_unknown_device_name_is_a_config_error_naming_variable_name_and_known(var, value, name):
    policy = DevicePolicy.from_env(environ={var: value})
    with pytest.raises(ConfigError) as exc:
        policy.validate(_toys())
    message = str(exc.value)
    assert message.startswith(f"{var}: unknown device {name!r}; known devices: fast, toy, "), message
    assert "cuda" in message  # rlx's own names are accepted, so they are listed


def test_rlx_own_backends_may_be_named_when_not_installed():
    # denying cuda on a host without rlx-cuda is legitimate: the same variables go to every host
    policy = DevicePolicy.from_env(environ={"RLX_DENY_DEVICES": "cuda,tpu:1", "RLX_PREFER_DEVICES": "opencl,jax",
                                            "RLX_DEVICES": "toy,cpu"})
    policy.validate(_toys())  # no error
    with pytest.raises(ConfigError, match=r"^DevicePolicy.deny: unknown device 'cdua'"):
        DevicePolicy(deny=("cdua",)).validate(_toys())


def test_placement_validates_the_policy_it_is_given():
    from rlx_core.placement.ranking import Placement

    with pytest.raises(ConfigError, match="RLX_DENY_DEVICES: unknown device 'foo'"):
        Placement(None, DevicePolicy.from_env(environ={"RLX_DENY_DEVICES": "foo"}), _toys())


# -- check_environment: every RLX_* variable, parsed up front ---------------------------


@pytest.mark.parametrize(("var", "value"), [
    ("RLX_FUSION_REPORT", "maybe"), ("RLX_MEMORY_LIMIT", "abc"), ("RLX_PROBE_TIMEOUT", "-1"),
    ("RLX_CALIBRATE_TIMEOUT", "soon"), ("RLX_ISOLATION", "yes"), ("RLX_DISABLE_PLUGINS", "cuda,,"),
    ("RLX_STRICT", "maybe"), ("RLX_DEVICES", "cpu,,"), ("RLX_BENCHMARK_PICK", "x"), ("RLX_REPICK_DRIFT", "0.5"),
    ("RLX_REPICK_FORGET", "soon"), ("RLX_MEMORY_LIMIT", "cuda=2G,,"),
])
def test_check_environment_names_the_malformed_variable(var, value):
    from rlx_core.run.settings import check_environment

    check_environment({})  # all unset: fine
    with pytest.raises(ConfigError, match=var):
        check_environment({var: value})


def test_every_listed_variable_is_checked_or_free_text():
    # a variable added to the catalogue (``rlx devices --explain``) but not to check_environment
    # would be parsed late again; these take any text
    from rlx_core.run.settings import check_environment

    free = {"RLX_CACHE_DIR"}
    for var, _, _ in environment_settings(environ={}):
        if var not in free:
            with pytest.raises(ConfigError, match=var):
                check_environment({var: "@@ not valid @@"})


def test_an_unknown_device_in_a_setting_is_a_config_error_and_a_device_error() -> None:
    """The caller's configuration (raised at once, no fallback) naming an unknown device
    (the contract's DeviceError for every unknown name): either ``except`` catches it."""
    from support import ToyBackend, registry_with

    import rlx_core as rlx
    from rlx_core.errors import UnknownDeviceError

    reg = registry_with(ToyBackend("toy"))
    for policy in (rlx.DevicePolicy(device="nosuch"), rlx.DevicePolicy.from_env(environ={"RLX_DENY_DEVICES": "nope"})):
        with pytest.raises(UnknownDeviceError) as info:
            rlx.device_report(policy=policy, registry=reg)
        assert isinstance(info.value, rlx.DeviceError) and isinstance(info.value, rlx.ConfigError)
